"""Worker processes killed mid-run (real Ray actors, real SIGKILL): the run completes, the
dead worker is replaced, and every issued sample is trained on or dropped exactly once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import ray

BASE = [
    "trainer.total_steps=5",
    "trainer.eval_every=0",
    "eval.num_prompts=16",
    "data.batch_size=8",
    "rollout.n_samples=4",
    "rollout.num_workers=1",
    "rollout.num_cpus_per_worker=0.5",
    "learner.num_cpus_per_rank=0.5",
    "learner.world_size=2",
    "algorithm.filter_uniform_groups=false",
    "task.reward=digit_fraction",
]


def _pid(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


def _kill_after(path, step: int, victim) -> threading.Thread:
    """SIGKILL the process of ``victim()`` once metrics.jsonl has logged ``step``."""

    def watch() -> None:
        while True:
            if path.exists() and any(
                json.loads(line)["step"] >= step for line in path.read_text().splitlines()
            ):
                os.kill(_pid(victim()), signal.SIGKILL)
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _run(tmp_path, tiny_model_dir, overrides, victim_of, kill_after_step, checkpoints):
    from rlsys.checkpoint.store import CheckpointStore
    from rlsys.data.tasks import load_task
    from rlsys.models.loading import load_tokenizer
    from rlsys.placement.resources import Roles
    from rlsys.resolve import load_config
    from rlsys.run.tracking import Tracker
    from rlsys.trainers.rl.controller import Controller
    from rlsys.workers.pools import start_pools

    cfg = load_config(BASE + overrides)
    pools = start_pools(cfg, tiny_model_dir, Roles.for_rl(cfg))
    tracker = Tracker(tmp_path, cfg.tracking, "t", {}, cfg.trainer.total_steps)
    store = CheckpointStore(tmp_path / "checkpoints", 2) if checkpoints else None
    try:
        watcher = _kill_after(tmp_path / "metrics.jsonl", kill_after_step, lambda: victim_of(pools))
        summary = Controller(
            cfg, pools, load_tokenizer(tiny_model_dir), load_task(cfg.task, 0), tracker, store
        ).run()
        watcher.join(5)
    finally:
        tracker.close()
        pools.shutdown()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return summary, [r["step"] for r in records if r["step"] > 0]


def _check_accounting(summary: dict) -> None:
    acc = summary["accounting"]
    assert acc["balanced"], acc
    assert acc["samples_issued"] == acc["samples_trained"] + sum(acc["samples_dropped"].values())


@pytest.mark.parametrize("staleness", [pytest.param(0, marks=pytest.mark.long), 1])
def test_a_killed_rollout_worker_is_replaced_and_its_prompts_reissued(
    ray_cpu, tiny_model_dir, tmp_path, staleness
):
    summary, steps = _run(
        tmp_path,
        tiny_model_dir,
        [f"buffer.max_staleness={staleness}", "weight_sync.transport=collective"],
        lambda pools: pools.rollout.workers[0],
        kill_after_step=2,
        checkpoints=False,
    )
    assert summary["restarts"] == {"rollout": 1, "learner": 0}
    assert summary["steps"] == 5 and steps == [1, 2, 3, 4, 5]
    _check_accounting(summary)
    # nothing was lost: every step trained on a full batch
    assert summary["accounting"]["samples_trained"] == 5 * 8 * 4


@pytest.mark.parametrize(
    ("overrides", "victim_of"),
    [
        pytest.param([], lambda pools: pools.learner.workers[1], id="learner"),
        pytest.param(  # frozen: replaced alone, the policy learner goes back to the checkpoint
            ["algorithm.kl_coef=0.01", "reference.world_size=2"],
            lambda pools: pools.reference.workers[1],
            id="reference",
        ),
    ],
)
def test_a_killed_learner_rank_restores_the_last_checkpoint(
    ray_cpu, tiny_model_dir, tmp_path, overrides, victim_of
):
    summary, steps = _run(
        tmp_path,
        tiny_model_dir,
        ["checkpoint.every=2", *overrides],
        victim_of,
        kill_after_step=3,
        checkpoints=True,
    )
    assert summary["restarts"] == {"rollout": 0, "learner": 1}
    assert summary["steps"] == 5
    assert steps == [1, 2, 3, 4, 5]  # the steps after the checkpoint were redone, logged once
    _check_accounting(summary)
    assert summary["accounting"]["samples_trained"] == 5 * 8 * 4


def test_nonfinite_gradients_skip_steps_then_stop_the_run(run_controller, tmp_path):
    with pytest.raises(RuntimeError, match=r"3 learner steps in a row .* non-finite"):
        run_controller(
            [
                "algorithm=dr_grpo",  # advantages not divided by the group's std
                "task.reward=huge_digit_fraction",
                "trainer.total_steps=6",
                "trainer.eval_every=0",
                "eval.num_prompts=16",
                "data.batch_size=8",
                "rollout.n_samples=4",
                "learner.world_size=1",
                "algorithm.filter_uniform_groups=false",
            ]
        )
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in records if r["step"] > 0]
    # steps 1 and 2 were logged with their optimizer steps skipped; step 3 stopped the run
    assert [r["step"] for r in trained] == [1, 2]
    assert all(r["train/skipped_steps"] >= 1 and r["train/grad_norm"] is None for r in trained)


# A learner rank that aborts (SIGABRT, as glibc's heap checks abort: docs/status.md) in any
# phase of `rlsys train`: the run goes back to its latest checkpoint and ends as a run that
# never failed. Three steps, a checkpoint after step 2 and at exit, the final export.
ABORT_RUN = [
    *BASE,
    "trainer.total_steps=3",
    "checkpoint.every=2",
    "warm_start.enabled=false",
    "tracking.console=false",
]
COMPARED = ("rollout/reward_mean", "rollout/response_tokens", "train/loss", "train/grad_norm")


def _train(tmp_path, name: str, *extra: str) -> tuple[dict, dict[int, dict], list[int]]:
    """``rlsys.commands.train.train`` in this process (``extra``: overrides): its summary,
    records by step, logged steps."""
    from rlsys.commands.train import train
    from rlsys.resolve import load_config

    cfg = load_config([*ABORT_RUN, *extra, f"run.output_dir={tmp_path}", f"run.name={name}"])
    summary = json.loads(train(cfg).read_text())
    records = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    by_step: dict[int, dict] = {}
    for record in records:
        by_step.setdefault(record["step"], {}).update(record)
    return summary, by_step, [r["step"] for r in records if "train/loss" in r]


def _weights(final: str) -> dict:
    from safetensors.torch import load_file

    return load_file(f"{final}/model.safetensors")


@pytest.fixture(scope="module")
def never_aborted(ray_cpu, tmp_path_factory):
    summary, by_step, steps = _train(tmp_path_factory.mktemp("whole"), "whole")
    assert summary["steps"] == 3 and steps == [1, 2, 3]
    return summary, by_step, _weights(summary["final_model"])


@pytest.mark.parametrize(
    "abort_at",
    [
        # rank 1 in step 3's update: back to step 2's checkpoint
        pytest.param("train_step:1:3", id="step"),
        # rank 0 writing step 2's checkpoint: back to the start (none is complete yet)
        pytest.param("save_checkpoint:0:1", id="checkpoint"),
        # rank 1 gathering the final export after the last step: step 3's checkpoint
        pytest.param("save_hf:1:1", id="final-save"),
        # rank 1 writing the checkpoint at exit (step 3): step 2's
        pytest.param("save_checkpoint:1:2", id="exit-checkpoint", marks=pytest.mark.long),
        # rank 0 sending step 2's weights to the engines: the start
        pytest.param("publish_weights:0:2", id="weight-sync", marks=pytest.mark.long),
    ],
)
def test_a_learner_rank_that_aborts_sends_the_run_back_to_its_checkpoint(
    never_aborted, tmp_path, monkeypatch, abort_at
):
    from rlsys.runtime import ABORT_ENV

    whole, whole_steps, whole_weights = never_aborted
    marker = tmp_path / "abort.marker"
    monkeypatch.setenv(ABORT_ENV, f"{abort_at}:{marker}")
    summary, by_step, steps = _train(tmp_path, "aborted")
    assert marker.exists(), "the rank did not abort"
    assert summary["restarts"] == {"rollout": 0, "learner": 1}
    assert summary["steps"] == 3 and steps == [1, 2, 3]  # redone steps logged once
    for step in (1, 2, 3):
        for key in COMPARED:
            assert by_step[step][key] == pytest.approx(whole_steps[step][key], rel=1e-6), (
                step,
                key,
            )
    assert summary["accounting"] == whole["accounting"]
    weights = _weights(summary["final_model"])
    assert weights.keys() == whole_weights.keys()
    assert all((weights[k] == whole_weights[k]).all() for k in weights)


@pytest.mark.long  # CI runs the final export's case; this export is the same learner call
def test_a_rank_that_aborts_in_the_best_policy_export_sends_the_run_back(
    never_aborted, tmp_path, monkeypatch
):
    """eval.validation_prompts: rank 1 dies gathering the step-0 evaluation's export to
    checkpoints/best; the run goes back to its start and trains as one never aborted (the
    validation evaluations are greedy and draw nothing), and keeps a best policy."""
    from rlsys.runtime import ABORT_ENV

    whole, whole_steps, whole_weights = never_aborted
    marker = tmp_path / "abort.marker"
    monkeypatch.setenv(ABORT_ENV, f"save_hf:1:1:{marker}")
    summary, by_step, steps = _train(tmp_path, "aborted", "eval.validation_prompts=16")
    assert marker.exists(), "the rank did not abort"
    assert summary["restarts"] == {"rollout": 0, "learner": 1}
    assert summary["steps"] == 3 and steps == [1, 2, 3]
    for step in (1, 2, 3):
        for key in COMPARED:
            assert by_step[step][key] == pytest.approx(whole_steps[step][key], rel=1e-6)
    weights = _weights(summary["final_model"])
    assert all((weights[k] == whole_weights[k]).all() for k in weights)
    assert summary["selected"]["step"] in (0, 3)
    assert (Path(summary["best_model"]) / "model.safetensors").exists()
