"""The colocated memory hand-over's order of stages, and what it does when a step fails
(rlsys/trainers/rl/handover.py), with recording stand-ins for the pools and the gate."""

from __future__ import annotations

import contextlib

import pytest

from rlsys.engines.base import WAKE_ALL
from rlsys.trainers.rl.handover import MemoryHandover


class Gate:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    @contextlib.contextmanager
    def shut(self):
        self.calls.append("gate shut")
        try:
            yield 0.0
        finally:
            self.calls.append("gate open")


class Rollout:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def sleep(self):
        self.calls.append("sleep")
        return [{"freed_bytes": 100.0, "rss_drop_bytes": None}]

    def wake(self, tags=WAKE_ALL):
        self.calls.append(f"wake {'+'.join(tags)}")
        return [{"wakes": 1, "taken_bytes": 90.0}]


class Pools:
    def __init__(self, calls: list, release_fails: bool = False) -> None:
        self.calls, self.release_fails = calls, release_fails
        self.rollout = Rollout(calls)

    def release_memory(self):
        self.calls.append("release")
        if self.release_fails:
            raise RuntimeError("a learner rank died")
        return {"memory/learner_released_bytes": 5.0}


class State:
    def __init__(self, calls: list) -> None:
        self.pipeline = type("Pipeline", (), {"gate": Gate(calls)})()


def _timer(stage: str):
    return contextlib.nullcontext()


def _handover(release_fails: bool = False) -> tuple[MemoryHandover, list]:
    calls: list = []
    return MemoryHandover(Pools(calls, release_fails), State(calls), True), calls


def test_engines_sleep_then_learners_release_then_weights_then_sync_then_kv_cache():
    handover, calls = _handover()
    metrics: dict = {}
    with handover.held(), handover.engines_asleep(_timer, metrics):
        calls.append("train")
    assert handover.kv_cache_asleep
    calls.append("sync")
    metrics.update(handover.wake_kv_cache(_timer))
    assert calls == [
        "gate shut",  # held: the whole step
        "gate shut",
        "sleep",
        "train",
        "release",
        "wake weights",
        "gate open",
        "gate open",
        "sync",
        "wake kv_cache",
    ]
    assert not handover.kv_cache_asleep and handover.wake_kv_cache(_timer) == {}
    assert metrics["memory/engine_freed_bytes"] == 100.0
    assert metrics["memory/learner_released_bytes"] == 5.0
    assert metrics["memory/engine_wake_bytes"] == metrics["memory/engine_kv_wake_bytes"] == 90.0


def test_a_failed_step_wakes_the_engines_whole_before_recovery():
    handover, calls = _handover()
    with pytest.raises(ValueError, match="rank died"), handover.engines_asleep(_timer, {}):
        raise ValueError("rank died mid-step")
    assert calls[-2:] == [f"wake {'+'.join(WAKE_ALL)}", "gate open"]
    assert "release" not in calls and not handover.kv_cache_asleep


def test_a_release_that_fails_does_not_keep_the_engines_asleep():
    handover, calls = _handover(release_fails=True)
    metrics: dict = {}
    with handover.engines_asleep(_timer, metrics):
        pass
    assert calls[-3:] == ["release", "wake weights", "gate open"]
    assert "memory/learner_released_bytes" not in metrics and handover.kv_cache_asleep


def test_without_sleep_nothing_happens_around_the_block():
    calls: list = []
    handover = MemoryHandover(Pools(calls), State(calls), enabled=False)
    with handover.held(), handover.engines_asleep(_timer, {}):
        calls.append("train")
    assert calls == ["train"] and handover.wake_kv_cache(_timer) == {}
