"""Worker processes killed mid-run (real Ray actors, real SIGKILL): the run completes, the
dead worker is replaced, and every issued sample is trained on or dropped exactly once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

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
    from rlsys.checkpoint import CheckpointStore
    from rlsys.data.tasks import load_task
    from rlsys.models.loading import load_tokenizer
    from rlsys.placement import Roles
    from rlsys.pools import start_pools
    from rlsys.resolve import load_config
    from rlsys.run.tracking import Tracker
    from rlsys.trainers.rl.controller import Controller

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
