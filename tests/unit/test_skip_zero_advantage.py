"""learner.skip_zero_advantage: rows whose advantage is 0 on every token are left out of the
train step where the loss makes them inert, the loss's normaliser still counting them, so the
update is the whole batch's; where a loss or term moves them, nothing is skipped."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlsys.algorithms.advantages import grpo_advantages
from rlsys.algorithms.objectives import PolicyObjective, SFTObjective, ValueObjective, inert_rows
from rlsys.algorithms.policy_losses import POLICY_LOSSES, ClipSettings, PolicyLossInputs
from rlsys.algorithms.settings import NoSettings
from rlsys.backends import build_backend
from rlsys.backends.data_parallel import train_plan
from rlsys.config.learner import LearnerConfig, OptimConfig
from rlsys.data.collate import pack
from rlsys.models.loading import load_tokenizer
from rlsys.resolve import load_config


def _zero_advantage_grad(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss ``name`` (default settings) and its gradient on tokens of advantage 0 whose
    log-probabilities moved from the old ones."""
    gen = torch.Generator().manual_seed(0)
    logprobs = (-torch.rand(3, 5, generator=gen) * 3).requires_grad_()
    old = logprobs.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    inputs = PolicyLossInputs(logprobs, old, torch.zeros(3, 5), torch.ones(3, 5))
    settings = (POLICY_LOSSES.settings(name) or NoSettings)()
    loss, _ = POLICY_LOSSES.get(name)(inputs, settings)
    loss.sum().backward()
    return loss.detach(), logprobs.grad


def test_advantage_weighted_losses_are_inert_at_zero_advantage():
    """Every loss declaring ``advantage_weighted`` gives zero loss and zero gradient at A = 0
    (what lets the learner skip such rows); DRO's log-ratio penalty does not."""
    weighted = POLICY_LOSSES.names(advantage_weighted=True)
    assert {"ppo_clip", "gspo", "cispo", "vanilla"} <= set(weighted)
    assert not {"dro", "clip_cov", "kl_cov"} & set(weighted)
    for name in weighted:
        loss, grad = _zero_advantage_grad(name)
        assert torch.count_nonzero(loss) == 0, name
        assert torch.count_nonzero(grad) == 0, name
    _, grad = _zero_advantage_grad("dro")
    assert torch.count_nonzero(grad) > 0


def test_inert_rows_need_zero_advantage_on_every_trained_token_and_an_inert_objective():
    mask = np.array([[0, 1, 1], [0, 1, 1], [0, 1, 0], [0, 0, 0]], np.float32)
    advantages = np.array([[0, 0, 0], [0, 0.5, 0.5], [0.7, 0, 0.7], [0, 0, 0]], np.float32)
    # row 2: advantages only off its trained tokens; row 3: nothing trained
    rows = inert_rows(PolicyObjective(), advantages, mask)
    assert rows.tolist() == [True, False, True, True]
    assert inert_rows(PolicyObjective("gspo"), advantages, mask).tolist() == rows.tolist()
    for moves_every_row in (
        PolicyObjective(entropy_coef=0.01),
        PolicyObjective(kl_coef=0.1),
        PolicyObjective("dro"),
        PolicyObjective("clip_cov"),
        ValueObjective(),
        SFTObjective(),
    ):
        assert inert_rows(moves_every_row, advantages, mask) is None, moves_every_row
    assert inert_rows(PolicyObjective(), None, mask) is None


def test_a_tied_group_gets_exactly_zero_advantage():
    """Three 0.1 rewards average to 0.1 + 1.4e-17; divided by the std's eps that was 1.4e-11,
    a row no skip could find."""
    assert (grpo_advantages(np.array([[0.1, 0.1, 0.1]])) == 0).all()
    assert (grpo_advantages(np.array([[0.1, 0.1, 0.1]]), normalize_std=False) == 0).all()
    assert (grpo_advantages(np.array([[0.0, 1.0, 1.0]])) != 0).all()


def test_plans_leave_inert_rows_out_but_count_their_tokens():
    """The mini-batches and their normalisers are those without the skip, their trained rows
    shared by the ranks; a mini-batch of inert rows only keeps its optimizer step, as an
    empty micro-batch on each rank."""
    mask = np.ones((8, 3), np.float32)
    mask[5, 2] = 0

    def rows(plans):  # per mini-batch, the rows of both ranks
        return [set(np.concatenate(p0.micro_batches + p1.micro_batches)) for p0, p1 in plans]

    plain = list(zip(*(train_plan(mask, 2, r, 2, 4, seed=0) for r in (0, 1)), strict=True))
    skip = np.zeros(8, bool)
    skip[list(rows(plain)[0])] = True  # the first mini-batch all inert
    skip[min(rows(plain)[1])] = True  # and one row of the second
    cut = list(zip(*(train_plan(mask, 2, r, 2, 4, 0, skip=skip) for r in (0, 1)), strict=True))
    assert len(cut) == len(plain) == 2
    for whole, skipped in zip(plain, cut, strict=True):
        for a, b in zip(whole, skipped, strict=True):
            assert (a.global_tokens, a.global_seqs) == (b.global_tokens, b.global_seqs)
    assert [len(p.micro_batches[0]) for p in cut[0]] == [0, 0]
    assert rows(cut)[1] == rows(plain)[1] - {min(rows(plain)[1])}
    assert [sum(map(len, p.micro_batches)) for p in cut[1]] == [2, 1]


@pytest.mark.parametrize("packing", [False, True])
def test_a_step_skipping_inert_rows_updates_like_one_training_every_row(
    one_rank, tiny_model_dir, packing
):
    """Groups of 4 replies, two of the four groups tied: the same gradient at each of the two
    optimizer steps (one mini-batch may hold only tied rows), the same weights after, the
    same normaliser, and half the rows through the model."""
    tok = load_tokenizer(tiny_model_dir)
    rng = np.random.default_rng(0)
    prompts = [
        tok.encode(f"{a}+{b}=", add_special_tokens=False) for a, b in rng.integers(0, 99, (4, 2))
    ]
    prompts = [prompts[i // 4] for i in range(16)]
    responses = [
        tok.encode(str(rng.integers(0, 10 ** rng.integers(1, 5))), add_special_tokens=False)
        + [tok.eos_token_id]
        for _ in prompts
    ]
    batch = pack(prompts, responses, tok.pad_token_id)
    rewards = rng.integers(0, 2, (4, 4)).astype(np.float64)
    rewards[1], rewards[3] = 1.0, 0.0  # tied groups
    rewards[0, :2], rewards[2, :2] = (0.0, 1.0), (1.0, 0.0)  # mixed ones
    batch.advantages = grpo_advantages(rewards).reshape(-1, 1) * batch.loss_mask
    objective = PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0))
    assert inert_rows(objective, batch.advantages, batch.loss_mask).sum() == 8
    runs = []
    for skip in (False, True):
        cfg = LearnerConfig(
            world_size=1,
            micro_batch_size=4,
            packing=packing,
            skip_zero_advantage=skip,
            optim=OptimConfig(lr=1e-3, warmup_steps=0),
        )
        backend = build_backend(cfg, tiny_model_dir, "float32", 1.0, torch.device("cpu"))
        grads, rows = [], []
        step = backend._step

        def recorded(lr, backend=backend, step=step, grads=grads):
            grads.append({n: p.grad.clone() for n, p in backend.module.named_parameters()})
            return step(lr)

        backend._step = recorded
        backend.module.register_forward_pre_hook(
            lambda _, args, kwargs, seen=rows: seen.append(len(kwargs["input_ids"])),
            with_kwargs=True,
        )
        metrics = backend.train_step(batch, objective, num_mini_batches=2, epochs=1, seed=3)
        weights = {n: p.detach().clone() for n, p in backend.module.named_parameters()}
        runs.append((metrics, grads, weights, sum(rows)))
    (whole, grads, weights, rows), (cut, grads2, weights2, rows2) = runs
    assert cut["skipped_rows_frac"] == 0.5 and "skipped_rows_frac" not in whole
    assert cut["trained_tokens"] == whole["trained_tokens"] == batch.loss_mask.sum()
    assert cut["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
    assert rows2 < rows
    assert len(grads) == len(grads2) == 2
    for want, got in zip(grads, grads2, strict=True):
        for name, grad in want.items():
            torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=0, msg=name)
    for name, value in weights.items():
        torch.testing.assert_close(weights2[name], value, atol=1e-5, rtol=0, msg=name)


def test_the_setting_is_refused_where_no_row_can_be_skipped():
    load_config(["learner.skip_zero_advantage=true"])  # GRPO's ppo_clip: fine
    for overrides, key in (
        (["algorithm.policy_loss=dro"], "algorithm.policy_loss=dro"),
        (["algorithm.entropy_coef=0.01"], "algorithm.entropy_coef"),
        (["algorithm.kl_coef=0.1", "algorithm.kl_penalty=loss"], "algorithm.kl_coef"),
    ):
        with pytest.raises(ValueError, match=key):
            load_config(["learner.skip_zero_advantage=true", *overrides])
    with pytest.raises(ValueError, match="critic.skip_zero_advantage"):
        load_config(["critic.skip_zero_advantage=true"])
