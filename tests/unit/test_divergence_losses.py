"""DPPO (binary TV and binary KL) and DRO: hand-computed examples (arithmetic in the comments),
the policy gradient at ratio 1, extreme inputs, their settings and presets."""

from __future__ import annotations

import math

import pytest
import torch

from rlsys.algorithms.divergence_losses import dppo_kl_loss, dppo_tv_loss, dro_loss
from rlsys.algorithms.losses import aggregate, ppo_clip_loss
from rlsys.algorithms.policy_losses import (
    POLICY_LOSSES,
    DppoKLSettings,
    DppoTVSettings,
    DroSettings,
    PolicyLossInputs,
)
from rlsys.algorithms.recipe import Recipe
from rlsys.algorithms.traits import has_ratio
from rlsys.config.algorithm import AlgorithmConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.resolve import load_config, resolve

LOSSES = ["dppo_tv", "dppo_kl", "dro"]


def _grad(loss: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    return torch.autograd.grad(loss.sum(), logp)[0]


def _probs(old: list[float], new: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi, log pi_old) of the sampled tokens from their probabilities; log pi has a grad."""
    return torch.tensor([new]).log().requires_grad_(), torch.tensor([old]).log()


# ---- DPPO-Binary-TV ---------------------------------------------------------------------------


def test_dppo_tv_hand_example():
    # q = pi_old, p = pi; delta 0.15 both sides; cap 20
    # 0: A +1, 0.5 -> 0.6: shift +0.1 <= 0.15 kept; ratio 1.2 -> value and grad -1.2
    # 1: A +1, 0.5 -> 0.7: shift +0.2 > 0.15 masked
    # 2: A -1, 0.5 -> 0.3: shift -0.2 < -0.15 masked
    # 3: A -2, 0.01 -> 0.001: shift -0.009 kept; ratio 0.1 -> -(-2) * 0.1 = +0.2
    # 4: A +1, 0.01 -> 0.05: shift +0.04 kept; ratio 5 -> -5
    # 5: A +1, 0.001 -> 0.1: shift +0.099 kept; ratio 100 capped at 20 -> -20
    logp, old = _probs([0.5, 0.5, 0.5, 0.01, 0.01, 0.001], [0.6, 0.7, 0.3, 0.001, 0.05, 0.1])
    adv = torch.tensor([[1.0, 1.0, -1.0, -2.0, 1.0, 1.0]])
    loss, metrics = dppo_tv_loss(logp, old, adv, 0.15, 0.15, 20.0)
    expected = torch.tensor([[-1.2, 0.0, 0.0, 0.2, -5.0, -20.0]])
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(_grad(loss, logp), expected)
    assert metrics["clipped"].tolist() == [[0.0, 1.0, 1.0, 0.0, 0.0, 0.0]]
    # PPO (0.2 / 0.28) clips the rare tokens 3 and 4 (ratios 0.1 and 5): no gradient there
    ppo, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    assert _grad(ppo, logp)[0, 3:5].tolist() == [0.0, 0.0]


def test_dppo_tv_bounds_are_per_direction():
    # A +1, 0.5 -> 0.7 (+0.2): kept under delta_high 0.25; A -1, 0.5 -> 0.3 (-0.2): masked
    # under delta_low 0.1; moving against the advantage is never masked (A -1, 0.2 -> 0.9)
    logp, old = _probs([0.5, 0.5, 0.2], [0.7, 0.3, 0.9])
    adv = torch.tensor([[1.0, -1.0, -1.0]])
    _, metrics = dppo_tv_loss(logp, old, adv, 0.1, 0.25, 20.0)
    assert metrics["clipped"].tolist() == [[0.0, 1.0, 0.0]]


# ---- DPPO-Binary-KL ---------------------------------------------------------------------------


def test_dppo_kl_hand_example():
    # KL(q || p) on {token, rest} = q ln(q / p) + (1 - q) ln((1 - q) / (1 - p)); delta 0.05
    # 0: A +1, 0.5 -> 0.6: 0.5 ln(5/6) + 0.5 ln(5/4) = -0.0912 + 0.1116 = 0.0204 kept; -1.2
    # 1: A +1, 0.5 -> 0.7: 0.5 ln(5/7) + 0.5 ln(5/3) = -0.1682 + 0.2554 = 0.0872, p > q: masked
    # 2: A -1, 0.5 -> 0.7: same KL 0.0872 but p >= q (against A's direction): kept; +1.4
    # 3: A -1, 0.5 -> 0.3: KL 0.0872 (symmetric), p < q: masked
    # 4: A +1, 0.01 -> 0.05: 0.01 ln(0.2) + 0.99 ln(0.99 / 0.95) = -0.0161 + 0.0408 = 0.0247
    #    kept; ratio 5 -> -5
    logp, old = _probs([0.5, 0.5, 0.5, 0.5, 0.01], [0.6, 0.7, 0.7, 0.3, 0.05])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])
    loss, metrics = dppo_kl_loss(logp, old, adv, 0.05, 0.05, 20.0)
    expected = torch.tensor([[-1.2, 0.0, 1.4, 0.0, -5.0]])
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(_grad(loss, logp), expected)
    assert metrics["clipped"].tolist() == [[0.0, 1.0, 0.0, 1.0, 0.0]]
    # a looser bound (0.09 > 0.0872) keeps tokens 1 and 3
    _, metrics = dppo_kl_loss(logp, old, adv, 0.09, 0.09, 20.0)
    assert not metrics["clipped"].any()


def test_dppo_kl_stays_finite_at_probability_one():
    logp, old = torch.zeros(1, 2, requires_grad=True), torch.tensor([[0.0, -1e-3]])
    loss, _ = dppo_kl_loss(logp, old, torch.tensor([[1.0, -1.0]]), 0.05, 0.05, 20.0)
    assert torch.isfinite(loss).all() and torch.isfinite(_grad(loss, logp)).all()


# ---- DRO --------------------------------------------------------------------------------------


def test_dro_hand_example():
    # loss -(A log pi - beta / 2 l^2), l = log pi - log pi_old; grad -A + beta l; beta 0.5
    # 0: log pi -1, old -1, A 2: -(2 * -1) = 2; grad -2
    # 1: log pi -0.5, old -1 (l 0.5), A 1: -(-0.5 - 0.25 * 0.25) = 0.5625; grad -1 + 0.25
    # 2: log pi -2, old -1 (l -1), A -1: -(2 - 0.25) = -1.75; grad 1 - 0.5 = 0.5
    logp = torch.tensor([[-1.0, -0.5, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    loss, metrics = dro_loss(logp, old, torch.tensor([[2.0, 1.0, -1.0]]), beta=0.5)
    torch.testing.assert_close(loss, torch.tensor([[2.0, 0.5625, -1.75]]))
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[-2.0, -0.75, 0.5]]))
    # k3 of l = 0.5: e^-0.5 - 1 + 0.5
    assert metrics["approx_kl"][0, 1].item() == pytest.approx(math.exp(-0.5) - 0.5)


# ---- all three ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSSES)
def test_at_ratio_one_the_gradient_is_the_policy_gradient(name):
    torch.manual_seed(0)
    logp = torch.randn(3, 5).clamp(max=-0.1).requires_grad_()
    adv = torch.randn(3, 5)
    x = PolicyLossInputs(logp, logp.detach(), adv, torch.ones(3, 5))
    loss, _ = POLICY_LOSSES.get(name)(x, POLICY_LOSSES.settings(name)())
    torch.testing.assert_close(_grad(loss, logp), -adv)


@pytest.mark.parametrize("name", LOSSES)
def test_extreme_log_ratios_and_padding_stay_finite(name):
    torch.manual_seed(8)
    logp = (-30.0 * torch.rand(4, 6)).requires_grad_()
    old = -30.0 * torch.rand(4, 6)
    adv = 5.0 * torch.randn(4, 1).expand(4, 6)
    mask = torch.ones(4, 6)
    mask[:, 4:] = 0.0
    x = PolicyLossInputs(logp, old, adv, mask)
    loss, metrics = POLICY_LOSSES.get(name)(x, POLICY_LOSSES.settings(name)())
    assert torch.isfinite(loss).all()
    assert all(torch.isfinite(v).all() and not v.requires_grad for v in metrics.values())
    grad = torch.autograd.grad(aggregate(loss, mask), logp)[0]
    assert torch.isfinite(grad).all() and torch.all(grad[:, 4:] == 0)


def test_registered_with_their_settings_and_the_ratio_trait():
    assert set(LOSSES) <= set(POLICY_LOSSES.names(ratio=True))
    assert POLICY_LOSSES.settings("dppo_tv") is DppoTVSettings
    assert POLICY_LOSSES.settings("dppo_kl") is DppoKLSettings
    assert POLICY_LOSSES.settings("dro") is DroSettings
    assert (DppoTVSettings().delta_low, DppoKLSettings().delta_high) == (0.15, 0.05)


def test_policy_loss_args_reach_the_loss():
    algo = AlgorithmConfig(
        policy_loss="dppo_tv", policy_loss_args={"delta_high": 0.3, "ratio_cap": 2.0}
    )
    objective = Recipe(algo, group_size=4, max_new_tokens=4).policy_objective()
    assert objective.loss_settings == DppoTVSettings(0.15, 0.3, 2.0)
    # 0.5 -> 0.7 (+0.2) is kept under delta_high 0.3, ratio 1.4 below the cap: -1.4;
    # 0.01 -> 0.05: ratio 5 capped at 2: -2
    logp, old = _probs([0.5, 0.01], [0.7, 0.05])
    batch = {"old_logprobs": old, "advantages": torch.ones(1, 2), "loss_mask": torch.ones(1, 2)}
    loss, _ = objective({"logprobs": logp}, batch)
    torch.testing.assert_close(loss, torch.tensor([[-1.4, -2.0]]))
    dro = Recipe(AlgorithmConfig(policy_loss="dro", policy_loss_args={"beta": 0.2}), 4, 4)
    assert dro.policy_objective().loss_settings == DroSettings(beta=0.2)


@pytest.mark.parametrize(
    ("loss", "args", "needle"),
    [
        ("dppo_tv", {"delta_low": 0.0}, r"algorithm.policy_loss_args.delta_low=0.0 must be > 0"),
        ("dppo_kl", {"ratio_cap": 0.5}, r"algorithm.policy_loss_args.ratio_cap=0.5 must be >= 1"),
        ("dro", {"beta": -1.0}, r"algorithm.policy_loss_args.beta=-1.0 must be > 0"),
        ("dro", {"tau": 1.0}, r"algorithm.policy_loss_args.tau is not a setting"),
    ],
)
def test_bad_settings_fail_at_load_naming_their_key(loss, args, needle):
    algo = AlgorithmConfig(policy_loss=loss, policy_loss_args=args)
    with pytest.raises(ConfigError, match=needle):
        resolve(TrainConfig(algorithm=algo))


@pytest.mark.parametrize("name", LOSSES)
def test_presets_set_their_loss_and_train_a_step(name):
    algo = load_config([f"algorithm={name}"]).algorithm
    assert algo.name == name and algo.policy_loss == name and algo.advantage == "grpo"
    assert algo.kl_coef == 0.0 and algo.loss_agg == "token_mean" and has_ratio(algo)
    torch.manual_seed(9)
    logp = (-torch.rand(4, 5) - 0.05).requires_grad_()
    batch = {
        "old_logprobs": logp.detach() + 0.1 * torch.randn(4, 5),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(4, 5),
        "loss_mask": torch.ones(4, 5),
    }
    objective = Recipe(algo, group_size=4, max_new_tokens=5).policy_objective()
    loss, _ = objective({"logprobs": logp}, batch)
    grad = torch.autograd.grad(aggregate(loss, batch["loss_mask"]), logp)[0]
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
