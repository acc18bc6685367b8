"""``reward.judge.model_path``: the run serves its judge itself (a Ray actor with an rlsys HF
engine behind an OpenAI-compatible endpoint) and scores 2 training steps through it. The judge
is the random built-in model, so the verdict is written into its reply's start
(``reward.judge.prefill``): a judge that answered nothing, or a request that failed, would
score 0 with an error, where this run must see the prefilled 7 of 10 on every reply."""

from __future__ import annotations

import pytest

from rlsys.run.doctor_checks import TRAIN_OVERRIDES


@pytest.mark.timeout(600)
def test_two_steps_scored_by_a_judge_the_run_serves(run_controller, tiny_model_dir):
    summary, steps = run_controller(
        [*TRAIN_OVERRIDES, "learner.world_size=1", "reward.weight=0"]
        + [f"reward.judge.model_path={tiny_model_dir}", "reward.judge.num_cpus=0.5"]
        + ["reward.judge.prefill='SCORE: 7\n'", "reward.judge.max_tokens=2"]
    )
    assert summary["steps"] == 2 and len(steps) == 2
    for step in steps:
        assert step["reward/judge"] == pytest.approx(0.7)
        assert step["rollout/reward_mean"] == pytest.approx(0.7)  # the judge is the reward
        assert step["rollout/reward_errors"] == 0
