"""Vision-language policies end to end on real Ray actors: `rlsys train model=tiny-vl
task=shapes` for 2 steps, engine/learner greedy agreement after weight syncs (vision tower
frozen and trained), and a saved Qwen2-VL directory loaded by path, generating and training."""

from __future__ import annotations

import numpy as np
import pytest

from rlsys.algorithms.objectives import SFTObjective
from rlsys.data.collate import attach_pixels, pack, samples_to_batch
from rlsys.data.tasks import load_task
from rlsys.models.loading import load_model, load_tokenizer
from rlsys.models.vision import VISION_PREFIX
from rlsys.placement.resources import Roles
from rlsys.resolve import load_config
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import SamplingParams
from rlsys.workers.pools import start_pools

SMALL = [
    "model=tiny-vl",
    "task=shapes",
    "task.train_size=64",
    "task.eval_size=16",
    "eval.num_prompts=16",
    "sft.eval_prompts=16",
    "data.batch_size=4",
    "rollout.n_samples=4",
    "rollout.num_cpus_per_worker=1",
    "algorithm.filter_uniform_groups=false",
]


def test_train_tiny_vl_on_shapes_for_two_steps(run_controller):
    # one learner rank: the sync test below trains the model on 2 ranks
    summary, steps = run_controller(
        [*SMALL, "trainer.total_steps=2", "algorithm.kl_coef=0.05", "learner.world_size=1"]
    )
    assert summary["steps"] == 2 and summary["policy_version"] == 2
    assert summary["samples"] == 2 * 4 * 4
    assert summary["accounting"]["balanced"]
    for record in steps:
        assert np.isfinite(record["train/loss"]) and np.isfinite(record["train/entropy"])
        assert np.isfinite(record["train/kl_ref"])
        assert record["rollout/response_tokens"] > 0


@pytest.mark.parametrize("freeze", [True, False], ids=["frozen-tower", "trained-tower"])
def test_vl_engine_matches_learner_greedy_after_sync(ray_cpu, tiny_vl_dir, freeze):
    cfg = load_config([*SMALL, f"model.freeze_vision={freeze}", "learner.optim.lr=3e-3"])
    tok = load_tokenizer(tiny_vl_dir)
    task = load_task(cfg.task, seed=0)
    pools = start_pools(cfg, tiny_vl_dir, Roles())
    try:
        collector = RolloutCollector.for_task(pools.generate, tok, cfg.task)
        train, train_ids = collector.encode(task.train[:32])
        batch = pack(
            train_ids,
            [tok.encode(p.answer, add_special_tokens=False) + [tok.eos_token_id] for p in train],
            tok.pad_token_id,
        )
        attach_pixels(batch, [p.pixels for p in train])
        names = [n for n, _ in load_model(tiny_vl_dir).named_parameters()]
        tower = sum(n.startswith(VISION_PREFIX) for n in names)
        for version in (1, 2):
            pools.learner.train_step(batch, SFTObjective(), seed=version)
            sent = pools.sync_weights(version)
            # a frozen tower never travels: the engines hold it already
            assert sent.num_tensors == len(names) - (tower if freeze else 0)
            groups = collector.generate(
                task.eval[:8], SamplingParams(greedy=True, max_new_tokens=3)
            )
            assert all(g.samples[0].completion.version == version for g in groups)
            check = samples_to_batch([g.samples[0] for g in groups], tok.pad_token_id)
            learner_next = pools.learner.greedy_tokens(check)
            mask = check.loss_mask > 0
            np.testing.assert_array_equal(learner_next[mask], check.input_ids[:, 1:][mask])
    finally:
        pools.shutdown()


def test_saved_qwen2_vl_directory_loads_by_path(run_controller, tmp_path):
    from rlsys.config.schema import ModelConfig
    from rlsys.models.builtin_vl import save_tiny_vl

    path = save_tiny_vl(ModelConfig(path="builtin:tiny-vl"), tmp_path / "qwen2-vl", seed=1)
    summary, steps = run_controller(
        [*SMALL, f"model.path={path}", "trainer.total_steps=1", "trainer.eval_every=0"]
        + ["learner.world_size=1"]
    )
    assert summary["steps"] == 1 and summary["policy_version"] == 1
    assert steps[0]["rollout/response_tokens"] > 0 and np.isfinite(steps[0]["train/loss"])
