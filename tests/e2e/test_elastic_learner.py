"""The learner group (and a PPO critic with it) resized mid-run on real Ray actors and gloo
(FSDP2): 1 -> 2 -> 1 ranks by ``learner.elastic.schedule``. Synchronous: the steps' batches and
updates match a run stopped at the first switch's checkpoint and resumed by hand on 2 ranks.
Asynchronous: generation goes on through the switches, every step is logged once, the policy
version runs on without a gap and issued = trained + dropped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

COMMON = [
    "warm_start.enabled=false",
    "trainer.total_steps=3",
    "trainer.eval_every=0",
    "eval.num_prompts=8",
    "data.batch_size=4",
    "rollout.n_samples=4",
    "rollout.num_workers=1",
    "rollout.num_cpus_per_worker=0.5",
    "learner.num_cpus_per_rank=0.5",
    "learner.world_size=1",
    "algorithm.filter_uniform_groups=false",
    "task.reward=digit_fraction",
    "checkpoint.keep=5",
    "tracking.console=false",
]
SCHEDULE = "learner.elastic.schedule={1:2,2:1}"
# What must match step for step: the batch (its rewards and lengths) and the update on it.
COMPARED = (
    "rollout/reward_mean",
    "rollout/response_tokens",
    "train/loss",
    "train/grad_norm",
    "train/entropy",
    "train/clip_frac",
)


def _train(run_dir: Path, overrides: list[str]) -> tuple[dict, dict[int, dict], list[int]]:
    """``rlsys.commands.train.train`` in this process; the summary, the records by step and
    the steps logged (with repeats)."""
    from rlsys.commands.train import train
    from rlsys.resolve import load_config

    cfg = load_config(
        [*COMMON, f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", *overrides]
    )
    summary = json.loads(train(cfg).read_text())
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = [r["step"] for r in records if "train/loss" in r]
    by_step: dict[int, dict] = {}
    for record in records:
        by_step.setdefault(record["step"], {}).update(record)
    return summary, by_step, logged


def _resume_copy(checkpoint: Path, run_dir: Path) -> str:
    """A run directory of its own holding ``checkpoint`` (so the resumed run leaves the
    original's files alone); returns the resume= value."""
    target = run_dir / "checkpoints" / checkpoint.name
    shutil.copytree(checkpoint, target)
    return f"resume={target}"


def _balanced(summary: dict) -> None:
    accounting = summary["accounting"]
    assert accounting["balanced"], accounting
    assert accounting["samples_trained"] == 3 * 4 * 4
    assert accounting["samples_dropped"]["failed"] == 0


@pytest.mark.long  # 100 s; CI resizes a running async run with `rlsys scale` (test_elastic)
def test_learner_resize_matches_a_run_resumed_by_hand(ray_cpu, tmp_path):
    scaled, steps, logged = _train(tmp_path / "scaled", [SCHEDULE])
    assert scaled["steps"] == 3 and logged == [1, 2, 3]
    assert scaled["scale_events"] == [
        {"step": 1, "pool": "learner", "from": 1, "to": 2},
        {"step": 2, "pool": "learner", "from": 2, "to": 1},
    ]
    assert [steps[s]["pool/learner_ranks"] for s in (1, 2, 3)] == [1, 2, 1]
    assert [steps[s]["policy/version"] for s in (1, 2, 3)] == [1, 2, 3]
    _balanced(scaled)

    # by hand: stopped after step 1 (the switch's checkpoint) and resumed on 2 ranks
    two = tmp_path / "two"
    _, by_hand, _ = _train(
        two,
        [_resume_copy(tmp_path / "scaled/checkpoints/step_000001", two), "learner.world_size=2"],
    )
    # step 2: the same ranks, checkpoint and batch; step 3: one rank against two, which differ
    # by float summation order (the tolerance of test_resume's world-size change)
    for step, rel in ((2, 1e-6), (3, 1e-4)):
        for key in COMPARED:
            if key in by_hand[step]:  # a resumed run's first batch was scored before the stop
                assert steps[step][key] == pytest.approx(by_hand[step][key], rel=rel, abs=1e-7), (
                    step,
                    key,
                )


PPO = ["algorithm=ppo", "critic.num_cpus_per_rank=0.5", "reference.num_cpus=0.5"]


@pytest.mark.long  # CI resizes an async run with `rlsys scale` (test_elastic.py)
@pytest.mark.parametrize("critic", [False, True], ids=["grpo", "ppo_critic_follows"])
def test_learner_resize_while_async_loses_and_repeats_nothing(ray_cpu, tmp_path, critic):
    summary, steps, logged = _train(
        tmp_path / "async",
        [
            SCHEDULE,
            "buffer.max_staleness=2",
            "algorithm.off_policy=decoupled",
            *(PPO if critic else []),
        ],
    )
    assert summary["steps"] == 3 and logged == [1, 2, 3]
    pools = ("learner", "critic") if critic else ("learner",)
    assert sorted((e["pool"], e["from"], e["to"]) for e in summary["scale_events"]) == sorted(
        [(pool, 1, 2) for pool in pools] + [(pool, 2, 1) for pool in pools]
    )
    for pool in pools:
        assert [steps[s][f"pool/{pool}_ranks"] for s in (1, 2, 3)] == [1, 2, 1]
    assert [steps[s]["policy/version"] for s in (1, 2, 3)] == [1, 2, 3]
    assert summary["policy_version"] == 3
    _balanced(summary)
