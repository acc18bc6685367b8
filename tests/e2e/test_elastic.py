"""The rollout pool resized mid-run on real Ray actors: by the config's schedule (async, with
partial rollouts, so retiring workers hold requests in flight) and by ``rlsys scale`` against
a running ``rlsys train`` (which resizes the learner group too). New workers get the current
weights before taking prompts; removed ones finish their requests; issued = trained + dropped
throughout. The learner group's own tests: test_elastic_learner.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "rollout.num_cpus_per_worker=0.5",  # three rollout workers and a learner fit 2 CPUs
    "learner.world_size=1",
    "learner.num_cpus_per_rank=0.5",
    "placement=disaggregated",
    "data.batch_size=4",
    "rollout.n_samples=4",
    "eval.num_prompts=8",
    "algorithm.filter_uniform_groups=false",
]


def _balanced(summary: dict, steps: int) -> None:
    accounting = summary["accounting"]
    assert accounting["balanced"], accounting
    assert accounting["samples_trained"] == steps * 4 * 4
    assert accounting["samples_issued"] == accounting["samples_trained"] + sum(
        accounting["samples_dropped"].values()
    )
    assert accounting["samples_dropped"]["failed"] == 0


@pytest.mark.long  # CI resizes with `rlsys scale` and checks new workers' weights
def test_schedule_grows_then_shrinks_the_pool_while_async(run_controller):
    summary, records = run_controller(
        [
            *SMALL,
            "task.reward=digit_fraction",  # rewards with variance from the first step
            "trainer.total_steps=7",
            "rollout.elastic.schedule={2:3,4:1}",
            "buffer.max_staleness=2",
            "rollout.partial_rollouts=true",
            "rollout.prompts_per_request=1",
            "rollout.stop_token_ids=[]",
            "task.max_new_tokens=16",
            "algorithm.off_policy=decoupled",
        ]
    )
    assert summary["steps"] == 7
    assert summary["scale_events"] == [
        {"step": 2, "pool": "rollout", "from": 1, "to": 3},
        {"step": 4, "pool": "rollout", "from": 3, "to": 1},
    ]
    workers = [r["pool/rollout_workers"] for r in records if "pool/rollout_workers" in r]
    assert workers == [1, 1, 3, 3, 1, 1, 1]
    assert max(r["buffer/staleness_max"] for r in records if "buffer/staleness_max" in r) <= 2
    _balanced(summary, 7)


def test_new_workers_hold_the_current_weights_before_taking_prompts(run_controller):
    # synchronous: a sample from an engine that missed the latest weights would be stale
    summary, records = run_controller(
        [*SMALL, "trainer.total_steps=4", "rollout.elastic.schedule={1:3}"]
    )
    assert summary["scale_events"] == [{"step": 1, "pool": "rollout", "from": 1, "to": 3}]
    steps = [r for r in records if "buffer/staleness_max" in r]
    assert [r["buffer/staleness_max"] for r in steps] == [0, 0, 0, 0]
    assert summary["accounting"]["samples_dropped"]["stale"] == 0
    _balanced(summary, 4)


def _steps_logged(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [r for r in map(json.loads, path.read_text().splitlines()) if r.get("step", 0) > 0]


def _wait_for(condition, proc: subprocess.Popen, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def _scale(run: Path, size: int) -> None:
    """Ask for ``size`` rollout workers and as many learner ranks, in one request."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlsys.cli",
            "scale",
            str(run),
            f"rollout={size}",
            f"learner={size}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0 and "requested rollout=" in result.stdout, result.stderr


def _sizes(record: dict) -> tuple:
    return record.get("pool/rollout_workers"), record.get("pool/learner_ranks")


@pytest.mark.slow
def test_rlsys_scale_resizes_a_running_train(tmp_path):
    run = tmp_path / "elastic"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlsys.cli",
            "train",
            *SMALL,
            "warm_start.enabled=false",
            "trainer.total_steps=60",
            "trainer.eval_every=0",
            "buffer.max_staleness=1",
            "cluster.num_cpus=2",
            f"run.output_dir={tmp_path}",
            "run.name=elastic",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: len(_steps_logged(run)) >= 2, proc)
        _scale(run, 2)
        _wait_for(lambda: any(_sizes(r) == (2, 2) for r in _steps_logged(run)), proc)
        _scale(run, 1)
        _wait_for(
            lambda: _sizes(_steps_logged(run)[-1]) == (1, 1) and len(_steps_logged(run)) < 60,
            proc,
        )
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 60
    events = [(e["pool"], e["from"], e["to"]) for e in summary["scale_events"]]
    assert sorted(events) == [
        ("learner", 1, 2),
        ("learner", 2, 1),
        ("rollout", 1, 2),
        ("rollout", 2, 1),
    ]
    assert len(summary["nodes"]["rollout"]) == 1  # the removed engine is gone
    assert len(summary["nodes"]["learner"]) == 1
    records = _steps_logged(run)
    assert [r["step"] for r in records if "train/loss" in r] == list(range(1, 61))
    assert [r["policy/version"] for r in records if "policy/version" in r] == list(range(1, 61))
    _balanced(summary, 60)


def _autoscaled(run_controller, extra: list[str]) -> tuple[dict, list[dict]]:
    return run_controller(
        [
            *SMALL,
            "task.reward=digit_fraction",
            "buffer.max_staleness=1",
            # a weight update aborts requests in flight (they continue under the new weights),
            # so the learner's waiting shows where the autoscaler reads it: wait_for_batch
            "rollout.partial_rollouts=true",
            "rollout.elastic.autoscale.enabled=true",
            "rollout.elastic.autoscale.window=2",
            *extra,
        ]
    )


def _autoscale_events(summary: dict) -> list[tuple[int, int]]:
    events = summary["scale_events"]
    for event in events:  # each decision records why
        assert event["source"] == "autoscale"
        assert 0 <= event["learner_idle_frac"] <= 1 and 0 <= event["rollout_idle_frac"] <= 1
    return [(e["from"], e["to"]) for e in events]


def test_autoscale_grows_the_pool_when_generation_is_the_bottleneck(run_controller):
    # every reply runs to 96 tokens (96 decoding passes) on one worker while the learner
    # takes one pass over the batch
    summary, records = _autoscaled(
        run_controller,
        [
            "trainer.total_steps=5",
            "rollout.elastic.autoscale.max_workers=2",
            "rollout.stop_token_ids=[]",
            "task.max_new_tokens=96",
            "learner.ppo_epochs=1",
        ],
    )
    assert _autoscale_events(summary) == [(1, 2)]
    grown = summary["scale_events"][0]
    assert grown["step"] <= 3 and grown["learner_idle_frac"] >= 0.25  # within a window
    workers = [r["pool/rollout_workers"] for r in records]
    assert workers[-1] == 2
    _balanced(summary, 5)


@pytest.mark.long  # the other direction of the same decision (unit-tested in test_autoscale)
def test_autoscale_shrinks_the_pool_when_the_learner_is_the_bottleneck(run_controller):
    # two workers, two-token replies, the learner taking 8 passes over each batch: the workers
    # sit at the staleness bound most of the time
    summary, _ = _autoscaled(
        run_controller,
        [
            "trainer.total_steps=5",
            "rollout.num_workers=2",
            "task.max_new_tokens=2",
            "learner.ppo_epochs=8",
        ],
    )
    assert _autoscale_events(summary) == [(2, 1)]
    assert summary["scale_events"][0]["step"] <= 3
    _balanced(summary, 5)
