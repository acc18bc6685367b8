"""Advantages, losses and KL estimators against hand-computed examples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlsys.algorithms.advantages import grpo_advantages
from rlsys.algorithms.losses import kl_estimate, nll_loss, ppo_clip_loss, token_mean
from rlsys.algorithms.objectives import PolicyGradientObjective


def test_grpo_advantages_hand_example():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = grpo_advantages(rewards, eps=0.0)
    # group 0: mean 0.5, unbiased std sqrt(1/3)
    s0 = math.sqrt(1 / 3)
    np.testing.assert_allclose(adv[0], [0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0], rtol=1e-6)
    # group 1: mean 0.75, unbiased std 0.5
    np.testing.assert_allclose(adv[1], [0.5, 0.5, 0.5, -1.5], rtol=1e-6)


def test_grpo_advantages_sum_to_zero_and_uniform_groups_are_zero():
    rng = np.random.default_rng(0)
    rewards = rng.random((16, 8))
    rewards[3] = 1.0
    adv = grpo_advantages(rewards)
    np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-5)
    assert np.all(adv[3] == 0)


def test_grpo_without_std_is_centred_rewards():
    rewards = np.array([[2.0, 0.0, 1.0]])
    np.testing.assert_allclose(grpo_advantages(rewards, normalize_std=False), [[1.0, -1.0, 0.0]])


def test_ppo_clip_hand_example():
    old = torch.zeros(1, 4)
    # ratios: 1.0, 1.5, 0.5, 1.1 ; advantages: +1, +1, -1, -2
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, 1.0, -1.0, -2.0]])
    loss, metrics = ppo_clip_loss(logp, old, adv, clip_low=0.2, clip_high=0.2)
    # token 1: min(1.5, 1.2) = 1.2 -> -1.2 ; token 2: min(-0.5, -0.8) = -0.8 -> 0.8
    # token 3: min(-2.2, -2.2) -> 2.2
    torch.testing.assert_close(loss, torch.tensor([[-1.0, -1.2, 0.8, 2.2]]))
    torch.testing.assert_close(metrics["clipped"], torch.tensor([[0.0, 1.0, 1.0, 0.0]]))


def test_ppo_with_ratio_one_equals_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    loss, _ = ppo_clip_loss(logp, logp.detach(), adv, 0.2, 0.2)
    loss.sum().backward()
    pg_grad = torch.autograd.grad((-adv * logp).sum(), logp)[0]
    torch.testing.assert_close(logp.grad, pg_grad)


def test_clip_higher_uses_its_own_upper_range():
    old = torch.zeros(1, 1)
    logp = torch.log(torch.tensor([[1.25]]))
    adv = torch.ones(1, 1)
    loss_sym, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2)
    loss_high, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    assert loss_sym.item() == pytest.approx(-1.2)
    assert loss_high.item() == pytest.approx(-1.25)


def test_kl_estimators_hand_values():
    logp = torch.tensor([math.log(0.5)])
    ref = torch.tensor([math.log(0.25)])
    log_r = math.log(0.5)  # ref - logp
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(-log_r)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5 * log_r**2)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 - 1 - log_r)
    assert kl_estimate(ref, ref, "k3").item() == 0.0
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(logp, ref, "k4")


def test_k3_is_an_unbiased_kl_estimate():
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    exact = float((p * (p / q).log()).sum())
    expected_k3 = float((p * kl_estimate(p.log(), q.log(), "k3")).sum())
    assert expected_k3 == pytest.approx(exact, rel=1e-5)


def test_token_mean_and_masks_exclude_padding():
    per_token = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert token_mean(per_token, mask, float(mask.sum())).item() == pytest.approx(2.0)
    assert token_mean(per_token, mask, 6.0).item() == pytest.approx(1.0)
    assert torch.equal(nll_loss(torch.tensor([-0.5])), torch.tensor([0.5]))


def test_objective_adds_kl_and_entropy_terms():
    logp = torch.zeros(1, 2)
    batch = {
        "old_logprobs": torch.zeros(1, 2),
        "advantages": torch.ones(1, 2),
        "ref_logprobs": torch.full((1, 2), math.log(0.5)),
    }
    entropy = torch.full((1, 2), 2.0)
    plain, _ = PolicyGradientObjective()(logp, entropy, batch)
    full, metrics = PolicyGradientObjective(kl_coef=0.1, entropy_coef=0.01)(logp, entropy, batch)
    k3 = 0.5 - 1 - math.log(0.5)
    torch.testing.assert_close(full, plain + 0.1 * k3 - 0.01 * 2.0)
    assert "kl_ref" in metrics


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    from rlsys.backends.schedule import lr_at

    args = {"peak": 1.0, "warmup_steps": 4, "min_lr_ratio": 0.1, "decay_steps": 14}
    assert [lr_at(s, schedule="cosine", **args) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(9, schedule="cosine", **args) == pytest.approx(0.55)  # half-way: mid value
    assert lr_at(14, schedule="cosine", **args) == pytest.approx(0.1)
    assert lr_at(99, schedule="cosine", **args) == pytest.approx(0.1)
    assert lr_at(9, schedule="constant", **args) == 1.0
    assert lr_at(9, schedule="cosine", **{**args, "decay_steps": None}) == 1.0
