"""Multi-turn environments in real runs: trajectories with masked observations through the
rollout workers, scoring and the learner; the calculator tool demo learns."""

from __future__ import annotations

import math

import pytest
from test_learning import train


def test_guess_number_trains_on_multi_turn_trajectories_with_gigpo(run_controller):
    # An untrained model's replies contain digits often enough to be guesses, so the game
    # answers and trajectories run several turns with observations between them. The game
    # answers every guess " higher" or " lower", so trajectories of a prompt that heard the
    # same answers share a state (the observation digest) and form GiGPO's step groups.
    summary, steps = run_controller(
        [
            "task=guess_number",
            "algorithm=gigpo",
            "task.eval_size=16",
            "eval.num_prompts=16",
            "sft.eval_prompts=16",
            "trainer.total_steps=2",
            "trainer.eval_every=0",
            "data.batch_size=4",
            "rollout.n_samples=4",
            "algorithm.filter_uniform_groups=false",
            "checkpoint.every=0",
            "learner.world_size=1",
        ]
    )
    assert summary["steps"] == 2 and summary["samples"] == 2 * 4 * 4
    assert summary["reward_errors"] == 0
    for record in steps:
        assert record["env/turns"] > 1.5  # most trajectories took several turns
        assert 0.0 < record["env/model_token_frac"] < 1.0  # observations were masked
        assert record["rollout/response_tokens"] <= 64  # task.env.max_total_tokens
        assert record["reward/env"] == record["rollout/reward_mean"]
        assert record["env/step_group_size"] > 1.0  # at least the first turns: all 4 share
        for key in ("train/loss", "train/entropy", "train/grad_norm"):
            assert math.isfinite(record[key])
    assert summary["policy_version"] == 2
    assert any(r["env/shared_state_frac"] > 0 for r in steps)  # later turns grouped too
    assert any(r["train/grad_norm"] > 0 for r in steps)


@pytest.mark.long  # about 85 s here; the test above already runs async turns (the default)
def test_async_turns_with_staleness_and_partial_rollouts(run_controller):
    # per-trajectory turns (task.env.scheduling=async, the default) with a one-step-off
    # learner and partial rollouts: the gate may abort a turn mid-request
    summary, steps = run_controller(
        [
            "task=guess_number",
            "task.env.scheduling=async",
            "buffer.max_staleness=1",
            "rollout.partial_rollouts=true",
            "trainer.total_steps=2",
            "trainer.eval_every=0",
            "data.batch_size=4",
            "rollout.n_samples=4",
            "algorithm.filter_uniform_groups=false",
            "checkpoint.every=0",
            "task.eval_size=16",
            "eval.num_prompts=16",
            "sft.eval_prompts=16",
        ]
    )
    assert summary["steps"] == 2 and summary["accounting"]["balanced"]
    for record in steps:
        assert record["env/turns"] > 1.5 and 0.0 < record["env/model_token_frac"] < 1.0
        assert record["env/tool_timeouts"] == 0 and record["env/tool_s"] >= 0.0
        assert 0.0 <= record["env/tool_overlap_frac"] <= 1.0
        assert record["rollout/response_tokens"] <= 64
        assert math.isfinite(record["train/loss"])


@pytest.mark.long
def test_calculator_tool_raises_held_out_accuracy(tmp_path):
    """`rlsys train task=calculator_tool`: SFT warm start on demonstrations, then GRPO over
    multi-turn tool-use trajectories (about 15 min on 2 CPU cores with a cold cache)."""
    summary = train(tmp_path, "calculator", "task=calculator_tool", timeout=2400)
    assert summary["eval_num_prompts"] >= 200
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.15
