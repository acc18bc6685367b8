"""``env/*`` per-step metrics of multi-turn trajectories (rlsys/trainers/rl/sample_metrics.py)."""

from __future__ import annotations

import pytest

from rlsys.trainers.rl.sample_metrics import episode_metrics
from rlsys.types import Completion, Episode, Prompt, Sample


def _sample(calls: int, errors: int, turns: int) -> Sample:
    episode = Episode(turns=turns, tool_calls=calls, tool_errors=errors)
    completion = Completion([0, 1, 2], [0.0] * 3, "stop", 0, episode=episode)
    return Sample(Prompt(0, "p", "a"), [1], completion, "")


def test_called_frac_counts_trajectories_not_calls():
    # two calls in one trajectory, one in another, a malformed one and none: 2 of 4 called
    samples = [_sample(2, 0, 3), _sample(1, 0, 2), _sample(0, 1, 2), _sample(0, 0, 1)]
    out = episode_metrics(samples)
    assert out["env/called_frac"] == 0.5
    assert out["env/tool_calls"] == pytest.approx(3 / 4)  # calls per trajectory, not trajectories
    assert out["env/tool_errors"] == pytest.approx(1 / 4)
    assert out["env/turns"] == pytest.approx(2.0)


def test_single_turn_samples_have_no_episode_metrics():
    flat = Sample(Prompt(0, "p", "a"), [1], Completion([0], [0.0], "stop", 0), "")
    assert episode_metrics([flat]) == {}
