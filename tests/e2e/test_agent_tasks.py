"""The sql and search tool tasks in real runs: a brief SFT on the environment's
demonstrations, then RL on trajectories with tool calls and masked tool results through the
rollout workers, scoring and the learner; each task learns from its warm start (long tier)."""

from __future__ import annotations

import math

import pytest
from test_learning import train

from rlsys.trainers.collector import RolloutCollector
from rlsys.trainers.sft import run_sft

SFT_STEPS = 40  # at sft.lr=3e-3: enough for the tiny model to write well-formed calls
SHORT_RUN = [
    "task.train_size=256",
    "task.eval_size=8",
    "eval.num_prompts=8",
    f"sft.max_steps={SFT_STEPS}",
    f"sft.eval_every={SFT_STEPS}",
    "sft.lr=3e-3",
    "sft.eval_prompts=8",
    "sft.target_accuracy=null",
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    "data.batch_size=4",
    "rollout.n_samples=2",
    "algorithm.filter_uniform_groups=false",
    "checkpoint.every=0",
    "learner.world_size=1",  # the tools are the subject, not the sharding
]


@pytest.fixture
def sft_then_rl(run_controller):
    """``run(overrides) -> (summary, step records)``: SFT on demonstrations, then the
    controller, on the same real pools from the tiny model."""

    def sft(cfg, pools, tokenizer, task) -> None:
        collector = RolloutCollector.for_task(pools.generate, tokenizer, cfg.task)
        run_sft(cfg.sft, pools, collector, task, tokenizer, 0)

    return lambda overrides: run_controller(overrides, before=sft)


@pytest.mark.parametrize("task", ["sql", "search"])
def test_tool_task_runs_two_steps_through_real_actors(run_controller, task):
    # CI's short run: no warm start, so the untrained model rarely writes a well-formed call
    # (its turns are mostly final answers the environment scores); the tools themselves are
    # checked in tests/unit/test_sql_tool.py and test_search_tool.py, calls through actors
    # in the long test below
    summary, steps = run_controller([f"task={task}", *SHORT_RUN])
    assert summary["steps"] == 2 and summary["samples"] == 2 * 4 * 2
    assert summary["reward_errors"] == 0
    for record in steps:
        assert record["env/turns"] >= 1.0
        assert record["reward/env"] == record["rollout/reward_mean"]
        for key in ("train/loss", "train/entropy", "train/grad_norm"):
            assert math.isfinite(record[key])


@pytest.mark.long  # the warm-up SFT inside takes most of 3-5 minutes per task here
@pytest.mark.parametrize(("task", "total_tokens"), [("sql", 160), ("search", 190)])
def test_tool_task_trains_on_tool_calling_trajectories(sft_then_rl, task, total_tokens):
    summary, steps = sft_then_rl([f"task={task}", *SHORT_RUN])
    assert summary["steps"] == 2 and summary["samples"] == 2 * 4 * 2
    assert summary["reward_errors"] == 0
    assert sum(record["env/tool_calls"] for record in steps) > 0  # the tool answered calls
    for record in steps:
        assert 0.0 < record["env/model_token_frac"] < 1.0  # tool results were masked
        assert record["rollout/response_tokens"] <= total_tokens  # task.env.max_total_tokens
        assert record["reward/env"] == record["rollout/reward_mean"]
        for key in ("train/loss", "train/entropy", "train/grad_norm"):
            assert math.isfinite(record[key])


@pytest.mark.long
@pytest.mark.parametrize("task", ["sql", "search"])
def test_tool_task_raises_held_out_accuracy(tmp_path, task):
    """`rlsys train task=sql` / `task=search`: SFT warm start on demonstrations, then GRPO over
    multi-turn tool-use trajectories."""
    # sql trains tiny-3m for 150 steps: about 1 h 5 min alone on a 2-core machine
    summary = train(tmp_path, task, f"task={task}", timeout=7200)
    assert summary["eval_num_prompts"] >= 200
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.15
