"""The reward layer in real runs: reward-model ensembles on their own actors, and sandboxed
code execution on reward worker actors, scoring inside the training pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

CODE_TASKS = Path(__file__).parents[1] / "fixtures" / "code_tasks.jsonl"
FAST = [
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    "eval.num_prompts=8",
    "task.eval_size=8",
    "sft.eval_prompts=8",
    "data.batch_size=4",
    "rollout.n_samples=4",
    "algorithm.filter_uniform_groups=false",
    "checkpoint.every=0",
    "rollout.num_cpus_per_worker=1",  # room beside the learner for the reward actors
    "learner.world_size=1",  # the reward layer is the subject, not the sharding
]


def test_reward_model_ensemble_scores_every_sample_in_training(run_controller, tmp_path):
    from rlsys.models.builtin import build_tiny_reward_model

    paths = [str(build_tiny_reward_model(tmp_path / f"rm{seed}", seed=seed)) for seed in (1, 2)]
    summary, steps = run_controller(
        [
            *FAST,
            "task.reward=digit_fraction",
            f"reward.model.paths=[{paths[0]},{paths[1]}]",
            "reward.model.ensemble=min",
            "reward.model.weight=0.5",
            "reward.model.num_cpus=0.25",
        ]
    )
    assert summary["steps"] == 2 and summary["reward_errors"] == 0
    for record in steps:
        model, verifier = record["reward/model"], record["reward/digit_fraction"]
        assert np.isfinite(model) and model != 0.0
        # the total is the verifier plus the weighted ensemble, sample by sample
        assert record["rollout/reward_mean"] == pytest.approx(verifier + 0.5 * model, abs=1e-6)


def test_code_reward_runs_sandboxed_on_reward_workers_in_training(run_controller):
    summary, steps = run_controller(
        [
            *FAST,
            "task.name=file",
            f"task.train_path={CODE_TASKS}",
            f"task.eval_path={CODE_TASKS}",
            "task.eval_size=6",
            "sft.eval_prompts=6",
            "eval.num_prompts=6",
            "task.max_prompt_tokens=200",
            "task.max_new_tokens=24",
            "task.reward=code_tests",
            "reward.num_workers=1",
            "reward.num_cpus_per_worker=0.25",
        ]
    )
    # the tiny model writes no working program: every sample ran and failed its tests
    assert summary["steps"] == 2 and summary["reward_errors"] == 0
    assert all(record["reward/code_tests"] == 0.0 for record in steps)


def test_code_reward_scores_reference_solutions_through_the_reward_workers(ray_cpu):
    from rlsys.config.reward import RewardConfig
    from rlsys.placement.resources import ActorResources
    from rlsys.rewards.service import RewardService

    rows = [json.loads(line) for line in CODE_TASKS.read_text().splitlines() if line.strip()]
    good = [(r["prompt"], f"```python\n{r['solution']}```", r) for r in rows]
    wrong = [(r["prompt"], "```python\nprint(42)\n```", r) for r in rows]
    service = RewardService(
        "code_tests", RewardConfig(num_workers=2, batch_size=4), ActorResources(0.25, 0.0, 1)
    )
    try:
        outcomes = service.score(good + wrong)
    finally:
        service.shutdown()
    assert [o.reward for o in outcomes[: len(rows)]] == [1.0] * len(rows)
    assert all(o.correct for o in outcomes[: len(rows)])
    assert all(o.reward < 1.0 and not o.correct for o in outcomes[len(rows) :])
    assert all(o.error is None for o in outcomes)
