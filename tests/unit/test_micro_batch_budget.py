"""learner.max_tokens_per_micro_batch: micro-batches hold as many rows as fit the token
budget; a step cut that way trains exactly as one micro-batch (the loss weights come from the
mini-batch, not the cut), forward passes score the same, the built-in CPU job keeps the
micro-batches it had, and the reference and reward-model groups get a budget of their own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlsys.algorithms.objectives import PolicyObjective
from rlsys.algorithms.policy_losses import ClipSettings
from rlsys.backends import build_backend
from rlsys.backends.data_parallel import micro_batch_rows
from rlsys.config.learner import LearnerConfig, OptimConfig
from rlsys.config.reward import RewardModelConfig
from rlsys.data.collate import pack
from rlsys.data.tasks import load_task
from rlsys.models.loading import load_tokenizer
from rlsys.resolve import load_config


def test_rows_fit_the_budget_and_at_least_one():
    assert micro_batch_rows(128, 16384, 11) == 128  # short rows: micro_batch_size rules
    assert micro_batch_rows(128, 16384, 1100) == 14  # 1k-token responses: the budget
    assert micro_batch_rows(128, 16384, 40_000) == 1  # one row longer than the budget
    assert micro_batch_rows(128, None, 40_000) == 128  # null: rows only


def test_the_default_cpu_job_keeps_its_micro_batches():
    """Its longest sequence (prompt + the task's response bound) leaves one micro-batch of
    micro_batch_size rows per rank, as before the budget."""
    cfg = load_config([])
    task = load_task(cfg.task, cfg.run.seed)
    longest = max(len(p.text) for p in task.train + task.eval) + task.max_new_tokens  # chars
    rows_per_rank = cfg.data.batch_size * cfg.rollout.n_samples // cfg.learner.world_size
    learner = cfg.learner
    assert longest < 16 and rows_per_rank == learner.micro_batch_size
    assert micro_batch_rows(learner.micro_batch_size, learner.max_tokens_per_micro_batch, 128) == (
        learner.micro_batch_size
    )


def test_reference_and_reward_model_groups_get_a_budget():
    cfg = load_config(
        ["learner.max_tokens_per_micro_batch=4096", "learner.logits_chunk_tokens=256"]
    )
    reference = cfg.reference.group(cfg.learner)
    assert (reference.max_tokens_per_micro_batch, reference.logits_chunk_tokens) == (4096, 256)
    reward = RewardModelConfig(batch_size=8, max_length=300).group()
    assert reward.micro_batch_size == 8 and reward.max_tokens_per_micro_batch == 8 * 300
    with pytest.raises(ValueError, match="learner.max_tokens_per_micro_batch"):
        load_config(["learner.max_tokens_per_micro_batch=0"])


def _batch(model_dir: str, rows: int = 11):
    tok = load_tokenizer(model_dir)
    rng = np.random.default_rng(0)
    prompts = [
        tok.encode(f"{a}+{b}=", add_special_tokens=False)
        for a, b in rng.integers(0, 999, (rows, 2))
    ]
    responses = [
        tok.encode(str(rng.integers(0, 10 ** rng.integers(1, 6))), add_special_tokens=False)
        + [tok.eos_token_id]
        for _ in prompts
    ]
    batch = pack(prompts, responses, tok.pad_token_id)
    batch.old_logprobs = np.zeros_like(batch.loss_mask) - 3.0
    batch.advantages = rng.standard_normal(rows).astype(np.float32)[:, None] * batch.loss_mask
    return batch


def _backend(model_dir: str, max_tokens: int | None, logits_chunk: int | None):
    """A one-rank learner that counts its micro-batches and records the gradients of every
    optimizer step."""
    cfg = LearnerConfig(
        world_size=1,
        micro_batch_size=64,  # every row at once, unless the token budget cuts
        max_tokens_per_micro_batch=max_tokens,
        logits_chunk_tokens=logits_chunk,
        optim=OptimConfig(lr=1e-3, warmup_steps=0),
    )
    backend = build_backend(cfg, model_dir, "float32", 1.0, torch.device("cpu"))
    backend.micro_batches, backend.grads = 0, []
    backward, step = backend._backward, backend._step

    def counted(loss, boundary):
        backend.micro_batches += 1
        backward(loss, boundary)

    def recorded(lr):
        backend.grads.append({n: p.grad.clone() for n, p in backend.module.named_parameters()})
        return step(lr)

    backend._backward, backend._step = counted, recorded
    return backend


@pytest.mark.parametrize("logits_chunk", [None, 5])
def test_a_budgeted_step_trains_like_one_micro_batch(one_rank, tiny_model_dir, logits_chunk):
    """Against one micro-batch per mini-batch (and the head unsliced): the same gradients at
    both optimizer steps, to 1e-6 (they agree to ~1e-8: float summation order), and the same
    weights after them to 1e-5: AdamW divides each gradient by its own magnitude, so the
    rounding of gradients near 0 shows in the weights at up to ~4e-6."""
    batch = _batch(tiny_model_dir)
    length = batch.input_ids.shape[1]
    # a sequence-mean token-mean loss and an entropy bonus: every weighting sees the cut
    objective = PolicyObjective(
        loss_settings=ClipSettings(dual_clip=3.0), loss_agg="seq_mean_token_mean", entropy_coef=0.01
    )
    runs = []
    for max_tokens in (None, 3 * length):
        backend = _backend(tiny_model_dir, max_tokens, logits_chunk if max_tokens else None)
        rows, logprobs = backend.forward_logprobs(batch)
        metrics = backend.train_step(batch, objective, num_mini_batches=2, epochs=1, seed=0)
        weights = {n: p.detach().clone() for n, p in backend.module.named_parameters()}
        runs.append((backend, rows, logprobs, metrics, weights))
    (whole, rows, logprobs, metrics, weights), (cut, rows2, logprobs2, metrics2, weights2) = runs
    assert whole.micro_batches == 2 and cut.micro_batches == 4  # 5 + 6 rows, 3 a micro-batch
    np.testing.assert_array_equal(rows, rows2)
    np.testing.assert_allclose(logprobs2, logprobs, atol=1e-6)
    for key in ("loss", "entropy", "grad_norm", "trained_tokens"):
        assert metrics2[key] == pytest.approx(metrics[key], rel=1e-5, abs=1e-6), key
    assert len(whole.grads) == len(cut.grads) == 2
    for want, got in zip(whole.grads, cut.grads, strict=True):
        for name, grad in want.items():
            torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=0, msg=name)
    for name, value in weights.items():
        torch.testing.assert_close(weights2[name], value, atol=1e-5, rtol=0, msg=name)
