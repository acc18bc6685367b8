"""The frozen reference policy as an inference-only learner group, on real Ray actors (gloo):
sharded over 2 ranks (FSDP2, DeepSpeed ZeRO-3) it scores what 1 rank and the plain model do,
and it holds no optimizer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlsys.models.loading import load_model
from rlsys.models.logprobs import first_scored, token_logprobs
from rlsys.placement.resources import Roles, plan_placement
from rlsys.resolve import load_config
from rlsys.workers.learner import LearnerGroup


def _batch(model_dir: str):
    from rlsys.data.collate import pack
    from rlsys.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    rng = np.random.default_rng(0)
    prompts = [
        tok.encode(f"{a}+{b}=", add_special_tokens=False) for a, b in rng.integers(0, 99, (7, 2))
    ]
    responses = [
        tok.encode(str(n), add_special_tokens=False) + [tok.eos_token_id]
        for n in rng.integers(0, 999, 7)
    ]
    return pack(prompts, responses, tok.pad_token_id)


def _plain_logprobs(model_dir: str, batch, temperature: float) -> np.ndarray:
    model = load_model(model_dir, "float32").eval()
    with torch.no_grad():
        logprobs, _ = token_logprobs(
            model,
            torch.from_numpy(batch.input_ids),
            torch.from_numpy(batch.attention_mask),
            temperature,
            first_scored(torch.from_numpy(batch.loss_mask)),
        )
    return logprobs.numpy()


def _reference_logprobs(cfg, model_dir: str, batch) -> np.ndarray:
    placement = plan_placement(cfg, Roles(reference=True))
    group = LearnerGroup(
        cfg.reference.group(cfg.learner),
        placement.reference,
        model_dir,
        cfg.model.dtype,
        cfg.rollout.temperature,
        trainable=False,
    )
    try:
        assert len(group.workers) == cfg.reference.world_size
        with pytest.raises(Exception, match="no optimizer"):
            group.train_step(batch, None, seed=0, num_mini_batches=1, epochs=1)
        return group.forward_logprobs(batch)
    finally:
        group.shutdown()


def test_a_reference_sharded_over_two_ranks_scores_like_one(ray_cpu, tiny_model_dir):
    batch = _batch(tiny_model_dir)
    base = ["algorithm.kl_coef=0.01", "learner.micro_batch_size=2"]
    cfg = load_config(base)
    one = _reference_logprobs(cfg, tiny_model_dir, batch)
    mask = batch.loss_mask > 0
    assert mask.sum() > 20 and np.all(one[mask] < 0)
    plain = _plain_logprobs(tiny_model_dir, batch, cfg.rollout.temperature)
    np.testing.assert_allclose(one[mask], plain[mask], atol=1e-5)
    for backend in ("fsdp2", "deepspeed"):  # FSDP2 and ZeRO-3 shard the parameters
        two = _reference_logprobs(
            load_config([*base, "reference.world_size=2", f"reference.backend={backend}"]),
            tiny_model_dir,
            batch,
        )
        np.testing.assert_allclose(two[mask], one[mask], atol=1e-5, err_msg=backend)


def test_a_lora_run_takes_its_reference_from_the_learner_base(ray_cpu, tiny_model_dir):
    """With LoRA and a KL term no reference group starts: the learner's base model (adapters
    off) scores a batch exactly as a separate reference group does, after the adapters have
    trained (so the policy itself no longer does), and the KL estimates agree."""
    from rlsys.algorithms.kl import kl_estimate
    from rlsys.algorithms.objectives import SFTObjective
    from rlsys.workers.pools import start_pools

    batch = _batch(tiny_model_dir)
    cfg = load_config(["algorithm.kl_coef=0.05", "model.lora.rank=8", "learner.optim.lr=1e-2"])
    roles = Roles.for_rl(cfg)
    assert cfg.algorithm.uses_reference and not roles.reference and cfg.reference_from_learner
    pools = start_pools(cfg, tiny_model_dir, roles)
    try:
        assert pools.reference is None  # no reference workers, no copy of the model
        for seed in range(3):
            pools.learner.train_step(batch, SFTObjective(), seed=seed)
        policy = pools.learner.forward_logprobs(batch)
        base = pools.learner.forward_base_logprobs(batch)
    finally:
        pools.shutdown()
    separate = _reference_logprobs(
        load_config(
            ["algorithm.kl_coef=0.05", "model.lora.rank=8", "reference.from_lora_base=false"]
        ),
        tiny_model_dir,
        batch,
    )
    mask = batch.loss_mask > 0
    np.testing.assert_allclose(base[mask], separate[mask], atol=1e-5)
    assert np.abs(policy[mask] - base[mask]).max() > 0.05  # the adapters did move the policy
    kind = cfg.algorithm.kl_estimator
    kl_ours = kl_estimate(torch.from_numpy(policy), torch.from_numpy(base), kind).numpy()
    kl_theirs = kl_estimate(torch.from_numpy(policy), torch.from_numpy(separate), kind).numpy()
    np.testing.assert_allclose(kl_ours[mask], kl_theirs[mask], atol=1e-5)
    assert np.abs(kl_ours[mask]).mean() > 1e-3
