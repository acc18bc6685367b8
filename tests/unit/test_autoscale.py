"""The rollout autoscaler's decisions (rlsys/trainers/rl/autoscale.py) on hand-made step
metrics: which way it moves, when it waits, and its bounds."""

from __future__ import annotations

import pytest

from rlsys.config.elastic import AutoscaleConfig, ElasticConfig
from rlsys.config.errors import ConfigError
from rlsys.resolve import load_config
from rlsys.trainers.rl.autoscale import Autoscaler


def _step(learner_idle: float, rollout_idle: float) -> dict[str, float]:
    return {"pool/learner_idle_frac": learner_idle, "pool/rollout_idle_frac": rollout_idle}


def _run(scaler: Autoscaler, steps: list[dict], workers: int) -> list[tuple[int, int]]:
    """(step index, new size) of each decision, the pool following it at once."""
    moves = []
    for i, metrics in enumerate(steps):
        decision = scaler.observe(metrics, workers)
        if decision is not None:
            moves.append((i, decision.target))
            workers = decision.target
    return moves


def test_a_waiting_learner_grows_the_pool_one_worker_a_window_up_to_the_max():
    cfg = AutoscaleConfig(enabled=True, max_workers=3, window=2, cooldown_steps=1)
    # a decision needs 2 steps of evidence, then 1 step of cooldown and 2 new ones
    assert _run(Autoscaler(cfg), [_step(0.6, 0.1)] * 10, workers=1) == [(1, 2), (4, 3)]


def test_an_idle_rollout_pool_with_a_busy_learner_shrinks_to_the_min():
    cfg = AutoscaleConfig(enabled=True, min_workers=2, window=2, cooldown_steps=0)
    assert _run(Autoscaler(cfg), [_step(0.05, 0.8)] * 10, workers=4) == [(1, 3), (3, 2)]


def test_between_the_thresholds_nothing_moves():
    cfg = AutoscaleConfig(enabled=True, window=2)
    # the learner waits a little (above half the grow threshold: no shrink), too little to grow
    assert _run(Autoscaler(cfg), [_step(0.2, 0.9)] * 6, workers=2) == []
    # both sides busy
    assert _run(Autoscaler(cfg), [_step(0.05, 0.1)] * 6, workers=2) == []


def test_the_window_averages_so_one_odd_step_does_not_move_the_pool():
    cfg = AutoscaleConfig(enabled=True, window=3)
    steps = [_step(0.05, 0.1), _step(0.9, 0.1), _step(0.05, 0.1)] * 2  # mean idle 0.33 > 0.25
    assert _run(Autoscaler(cfg), steps[:2], workers=1) == []
    assert _run(Autoscaler(AutoscaleConfig(enabled=True, window=3)), steps, workers=1) == [(2, 2)]


def test_a_grow_that_found_no_room_caps_the_pool_there():
    scaler = Autoscaler(AutoscaleConfig(enabled=True, max_workers=4, window=1, cooldown_steps=0))
    assert scaler.observe(_step(0.6, 0.1), 1).target == 2
    assert scaler.observe(_step(0.6, 0.1), 1) is None  # still 1: the cluster had no room
    assert scaler.max_workers == 1


def test_an_async_run_also_skips_the_batches_generated_ahead():
    cfg = AutoscaleConfig(enabled=True, window=1, cooldown_steps=1)
    scaler = Autoscaler(cfg, ahead_steps=2)
    assert scaler.observe(_step(0.6, 0.1), 1).target == 2
    assert [scaler.observe(_step(0.6, 0.1), 2) for _ in range(3)] == [None] * 3  # 1 + 2
    assert scaler.observe(_step(0.6, 0.1), 2).target == 3


def test_a_request_restarts_the_measurement():
    scaler = Autoscaler(AutoscaleConfig(enabled=True, window=2, cooldown_steps=1))
    scaler.observe(_step(0.6, 0.1), 1)
    scaler.restart()  # e.g. `rlsys scale` resized the pool
    assert scaler.observe(_step(0.6, 0.1), 3) is None  # cooldown
    assert scaler.observe(_step(0.6, 0.1), 3) is None  # one step of the window
    decision = scaler.observe(_step(0.6, 0.1), 3)
    assert decision.target == 4
    assert decision.figures == {"learner_idle_frac": 0.6, "rollout_idle_frac": 0.1}


def test_steps_without_the_figures_are_skipped():
    scaler = Autoscaler(AutoscaleConfig(enabled=True, window=1, cooldown_steps=0))
    assert scaler.observe({"pool/rollout_workers": 1}, 1) is None


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("rollout.elastic.autoscale.max_workers=0", "max_workers=0 is below"),
        ("rollout.elastic.autoscale.grow_learner_idle=1.5", "grow_learner_idle"),
        ("rollout.elastic.autoscale.window=0", "rollout.elastic.autoscale.window"),
        (
            "rollout.elastic.autoscale.enabled=true rollout.num_workers=5",
            "rollout.num_workers=5 is outside",
        ),
    ],
)
def test_bad_settings_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(override.split())
    assert ElasticConfig().autoscale.enabled is False
