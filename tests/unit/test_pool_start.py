"""Pools start at the same time, and a failed start stops the ones that came up."""

from __future__ import annotations

import threading

import pytest

from rlsys.workers.pools import _start_at_once


def test_pools_start_concurrently_and_return_by_name():
    both_running = threading.Barrier(2, timeout=10)  # broken if the starters ran in turn

    def start(name):
        both_running.wait()
        return name.upper()

    up = _start_at_once(
        {"rollout": lambda: start("rollout"), "learner": lambda: start("learner")}, print
    )
    assert up == {"rollout": "ROLLOUT", "learner": "LEARNER"}


def test_a_failed_start_stops_the_others_and_raises_its_error():
    stopped = []

    def fail():
        raise RuntimeError("learner rank 1 died while loading")

    with pytest.raises(RuntimeError, match="rank 1 died"):
        _start_at_once(
            {"rollout": lambda: "engines", "learner": fail, "critic": lambda: "c"}, stopped.append
        )
    assert sorted(stopped) == ["c", "engines"]
