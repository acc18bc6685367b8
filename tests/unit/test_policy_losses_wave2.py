"""CISPO, GMPO, SAPO, Clip-Cov and KL-Cov: hand-computed examples, the invariants each loss
promises (policy gradient at ratio 1, GMPO's per-token form equal to its sequence objective),
masks, extreme inputs, and their config keys and presets."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rlsys.algorithms.losses import (
    aggregate,
    cispo_loss,
    clip_cov_loss,
    gmpo_loss,
    kl_cov_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    sapo_loss,
    token_covariance,
)
from rlsys.algorithms.objectives import PolicyObjective
from rlsys.algorithms.policy_losses import (
    POLICY_LOSSES,
    KLCovSettings,
    PolicyLossInputs,
    SapoSettings,
)
from rlsys.algorithms.recipe import Recipe
from rlsys.algorithms.traits import has_ratio
from rlsys.config.algorithm import AlgorithmConfig
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.resolve import load_config, resolve

NEW_LOSSES = ["cispo", "gmpo", "sapo", "clip_cov", "kl_cov"]


def _grad(loss: torch.Tensor, logp: torch.Tensor, mask=None, mode="token_mean"):
    """Gradient of the aggregated loss (the plain sum when ``mask`` is None)."""
    total = loss.sum() if mask is None else aggregate(loss, mask, mode)
    return torch.autograd.grad(total, logp)[0]


def _pg_grad(logp, adv, mask=None, mode="token_mean"):
    pg, _ = policy_gradient_loss(logp, adv)
    return _grad(pg, logp, mask, mode)


# ---- CISPO ----------------------------------------------------------------------------------


def test_cispo_hand_example_keeps_the_gradient_of_clipped_tokens():
    old = torch.zeros(1, 4)
    # ratios 1.0, 1.5, 0.5, 3.0 ; advantages +1, +1, -1, +2 ; range [0.8, 1.28]
    logp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 3.0]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, 2.0]])
    loss, metrics = cispo_loss(logp, old, adv, clip_low=0.2, clip_high=0.28)
    # weights 1.0, 1.28, 0.8, 1.28 ; value and gradient (d/dlog pi) both -A * w
    expected = torch.tensor([[-1.0, -1.28, 0.8, -2.56]])
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(_grad(loss, logp), expected)
    assert metrics["clipped"].tolist() == [[0.0, 1.0, 1.0, 1.0]]
    # PPO on the same tokens: the clipped ones (1, 2, 3) get no gradient at all
    ppo, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    assert _grad(ppo, logp)[0, 1:].tolist() == [0.0, 0.0, 0.0]


def test_cispo_at_ratio_one_equals_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    loss, metrics = cispo_loss(logp, logp.detach(), adv, 0.2, 0.28)
    torch.testing.assert_close(loss, -adv)  # w = 1: value -A
    torch.testing.assert_close(_grad(loss, logp), _pg_grad(logp, adv))
    assert not metrics["clipped"].any()


def test_cispo_clip_low_of_one_or_more_removes_the_lower_bound():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[0.01, 10.0]])).requires_grad_()  # ratios 0.01, 10
    adv = torch.tensor([[-1.0, 1.0]])
    loss, metrics = cispo_loss(logp, old, adv, clip_low=1.0, clip_high=5.0)
    # range [0, 6]: 0.01 stays (A<0: +0.01) ; 10 -> 6 (A>0: -6)
    torch.testing.assert_close(loss, torch.tensor([[0.01, -6.0]]))
    assert metrics["clipped"].tolist() == [[0.0, 1.0]]


# ---- GMPO -----------------------------------------------------------------------------------


def test_gmpo_hand_example():
    old = torch.zeros(2, 2)
    # row 0, A = +1: log-ratios 0.6, -0.8 -> c = min(l, clip(l, -0.4, 0.4)) = 0.4, -0.8
    #   (the pessimistic side: a plain clip would give 0.4, -0.4 and R = 1)
    #   R = exp(-0.2) = 0.8187 ; every token's loss -R
    # row 1, A = -1: log-ratios -0.6, 0.8 -> c = max(l, clip(l)) = -0.4, 0.8
    #   R = exp(0.2) = 1.2214 ; every token's loss +R
    logp = torch.tensor([[0.6, -0.8], [-0.6, 0.8]], requires_grad=True)
    adv = torch.tensor([[1.0], [-1.0]]).expand(2, 2)
    mask = torch.ones(2, 2)
    loss, metrics = gmpo_loss(logp, old, adv, mask, 0.4, 0.4)
    r0, r1 = math.exp(-0.2), math.exp(0.2)
    torch.testing.assert_close(loss, torch.tensor([[-r0, -r0], [r1, r1]]))
    assert metrics["clipped"].tolist() == [[1.0, 0.0], [1.0, 0.0]]
    # seq_mean_token_mean over 2 sequences: d/dl_t = -A * R * (dc_t/dl_t) / |y| / 2,
    # dc/dl = 0 on clipped tokens
    grad = _grad(loss, logp, mask, "seq_mean_token_mean")
    torch.testing.assert_close(grad, torch.tensor([[0.0, -r0 / 4], [0.0, r1 / 4]]))


def _gmpo_sequence_objective(logp, old, adv_seq, mask, low, high):
    """GMPO written directly per sequence: mean over sequences of -A * prod(r_t)^(1/|y|) with
    the sign-aware clip, only the trained tokens, one sequence at a time."""
    losses = []
    for i in range(logp.shape[0]):
        keep = mask[i] > 0
        lr = (logp[i] - old[i])[keep]
        a = adv_seq[i]
        if a > 0:
            c = torch.minimum(lr, lr.clamp(-low, high))
        else:
            c = torch.maximum(lr, lr.clamp(-low, high))
        losses.append(-a * torch.exp(c.mean()))
    return torch.stack(losses).mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gmpo_per_token_form_equals_the_sequence_objective(seed):
    torch.manual_seed(seed)
    logp = (0.5 * torch.randn(5, 7)).requires_grad_()
    old = logp.detach() + 0.4 * torch.randn(5, 7)  # many tokens on both sides of +-0.4
    mask = (torch.rand(5, 7) > 0.3).float()
    mask[:, 0] = 1.0
    adv_seq = torch.tensor([1.5, -0.7, 0.3, -2.0, 1.0])
    adv = adv_seq[:, None].expand(5, 7)
    loss, _ = gmpo_loss(logp, old, adv, mask, 0.4, 0.4)
    ours = aggregate(loss, mask, "seq_mean_token_mean")
    direct = _gmpo_sequence_objective(logp, old, adv_seq, mask, 0.4, 0.4)
    torch.testing.assert_close(ours, direct)
    torch.testing.assert_close(
        torch.autograd.grad(ours, logp)[0], torch.autograd.grad(direct, logp)[0]
    )


def test_gmpo_at_ratio_one_has_the_sequence_mean_policy_gradient():
    torch.manual_seed(3)
    logp = torch.randn(4, 6, requires_grad=True)
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[:, 0] = 1.0
    adv = torch.randn(4, 1).expand(4, 6)
    loss, metrics = gmpo_loss(logp, logp.detach(), adv, mask, 0.4, 0.4)
    torch.testing.assert_close(loss, -adv)  # R = 1
    grad = _grad(loss, logp, mask, "seq_mean_token_mean")
    torch.testing.assert_close(grad, _pg_grad(logp, adv, mask, "seq_mean_token_mean"))
    assert not metrics["clipped"].any()


def test_gmpo_padding_does_not_enter_the_sequence_ratio():
    old = torch.zeros(1, 3)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    adv = torch.ones(1, 3)
    a, _ = gmpo_loss(torch.tensor([[0.1, 0.1, 0.0]]), old, adv, mask, 0.4, 0.4)
    b, _ = gmpo_loss(torch.tensor([[0.1, 0.1, -9.0]]), old, adv, mask, 0.4, 0.4)
    torch.testing.assert_close(a[0, :2], b[0, :2])
    torch.testing.assert_close(a[0, :2], torch.full((2,), -math.exp(0.1)))


def test_a_stale_negative_sequence_moves_the_gmpo_loss_by_at_most_its_clamp():
    # A < 0 leaves c_t unbounded above: mean log-ratio 30 would be e^30 = 1e13 per token
    old = torch.zeros(1, 3)
    logp = torch.full((1, 3), 30.0, requires_grad=True)
    adv = torch.full((1, 3), -2.0)
    loss, _ = gmpo_loss(logp, old, adv, torch.ones(1, 3), 0.4, 0.4)  # default clamp 10
    torch.testing.assert_close(loss, torch.full((1, 3), 2.0 * math.exp(10.0)))
    assert torch.all(_grad(loss, logp) == 0)  # beyond the clamp: no gradient


# ---- SAPO -----------------------------------------------------------------------------------


def test_sapo_hand_example():
    old = torch.zeros(1, 4)
    # ratios 1, 1, e^0.5 = 1.6487, e^0.5 ; advantages +1, -1, +1, -1 ; tau 1.0 / 1.05
    logp = torch.tensor([[0.0, 0.0, 0.5, 0.5]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, metrics = sapo_loss(logp, old, adv, tau_pos=1.0, tau_neg=1.05)
    # f(1) = sigmoid(0) * 4 / tau = 2 / tau: -2 and +2 / 1.05 = 1.9048
    # f(1.6487) = sigmoid(0.6487) * 4 = 2.6269 (tau 1) ; sigmoid(0.6812) * 4 / 1.05 = 2.5295
    expected = torch.tensor([[-2.0, 2.0 / 1.05, -2.6268890, 2.5295122]])
    torch.testing.assert_close(loss, expected)
    assert set(metrics) == {"approx_kl"}


@pytest.mark.parametrize("tau_pos,tau_neg", [(1.0, 1.05), (0.5, 3.0), (7.0, 2.0)])
def test_sapo_at_ratio_one_equals_policy_gradient_for_any_temperature(tau_pos, tau_neg):
    # d/dlog pi of -A sigmoid(tau (r - 1)) 4 / tau = -A * 4 sigmoid'(0) * r = -A at r = 1
    torch.manual_seed(4)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    loss, _ = sapo_loss(logp, logp.detach(), adv, tau_pos, tau_neg)
    torch.testing.assert_close(_grad(loss, logp), _pg_grad(logp, adv))


def test_sapo_gradient_fades_off_ratio_one_faster_for_the_larger_temperature():
    # at r = 2 the gradient weight is 4 s (1 - s) r with s = sigmoid(tau): 1.5729 for tau 1,
    # 1.5362 for tau 1.05 (d/dlog pi = -A * weight)
    logp = torch.full((1, 2), math.log(2.0), requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]])
    loss, _ = sapo_loss(logp, torch.zeros(1, 2), adv, tau_pos=1.0, tau_neg=1.05)
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[-1.5728955, 1.5362196]]))
    # far off-policy: the gate saturates at 4 / tau and the gradient all but vanishes
    far = torch.full((1, 2), 15.0, requires_grad=True)
    loss, _ = sapo_loss(far, torch.zeros(1, 2), adv, 1.0, 1.05)
    torch.testing.assert_close(loss, torch.tensor([[-4.0, 4.0 / 1.05]]))
    assert _grad(loss, far).abs().max() < 1e-6


# ---- covariance, Clip-Cov -------------------------------------------------------------------


def test_token_covariance_hand_example_uses_trained_tokens_only():
    # trained log pi -1, -3, -2 (mean -2) ; A 2, -1, -1 (mean 0) ; last token padding
    logp = torch.tensor([[-1.0, -3.0, -2.0, 50.0]])
    adv = torch.tensor([[2.0, -1.0, -1.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # (1)(2) = 2 ; (-1)(-1) = 1 ; (0)(-1) = 0 ; padding 0
    cov = token_covariance(logp, adv, mask)
    torch.testing.assert_close(cov, torch.tensor([[2.0, 1.0, 0.0, 0.0]]))


def _cov_case():
    # trained log pi -1, -3, -2, -2 (mean -2) ; A 2, 0, 1, -3 (mean 0)
    # covariances 2, 0, 0, 0: only token 0 lies in [1, 5]
    logp = torch.tensor([[-1.0, -3.0, -2.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, 0.0, 1.0, -3.0]])
    return logp, adv, torch.ones(1, 4)


def test_clip_cov_hand_example_detaches_the_one_candidate():
    logp, adv, mask = _cov_case()
    # ratio 1; 4 trained tokens x 0.02 rounds to 0, so the one-token minimum applies
    loss, metrics = clip_cov_loss(logp, logp.detach(), adv, mask, 0.2, 0.2, 0.02, 1.0, 5.0)
    torch.testing.assert_close(loss, -adv)  # the values stay PPO's
    assert metrics["cov_selected"].tolist() == [[1.0, 0.0, 0.0, 0.0]]
    # gradient -A per token, except token 0's (detached)
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[0.0, 0.0, -1.0, 3.0]]))


def test_clip_cov_without_candidates_is_ppo():
    logp, adv, mask = _cov_case()
    old = logp.detach() - 0.1
    loss, metrics = clip_cov_loss(logp, old, adv, mask, 0.2, 0.2, 0.5, 3.0, 5.0)  # cov 2 < 3
    ppo, ppo_metrics = ppo_clip_loss(logp, old, adv, 0.2, 0.2)
    torch.testing.assert_close(loss, ppo)
    torch.testing.assert_close(_grad(loss, logp), _grad(ppo, logp))
    assert not metrics["cov_selected"].any()
    torch.testing.assert_close(metrics["clipped"], ppo_metrics["clipped"])


def test_clip_cov_skips_tokens_ppo_already_clipped():
    logp, adv, mask = _cov_case()
    old = logp.detach().clone()
    old[0, 0] -= 1.0  # token 0 (the only candidate): ratio e = 2.72 > 1.2 with A > 0: clipped
    _, metrics = clip_cov_loss(logp, old, adv, mask, 0.2, 0.2, 0.5, 1.0, 5.0)
    assert metrics["clipped"][0, 0] == 1.0
    assert not metrics["cov_selected"].any()


def test_clip_cov_picks_its_share_of_candidates_at_random():
    torch.manual_seed(5)
    logp = torch.randn(8, 16, requires_grad=True)
    adv = 3.0 * torch.randn(8, 1).expand(8, 16)
    mask = (torch.rand(8, 16) > 0.25).float()
    n = int(mask.sum())
    cov = token_covariance(logp, adv, mask)
    candidates = (mask > 0) & (cov >= 0.5) & (cov <= 10.0)
    assert candidates.sum() > 20  # the case must leave a choice

    def pick(seed):
        torch.manual_seed(seed)
        _, m = clip_cov_loss(logp, logp.detach(), adv, mask, 0.2, 0.2, 0.1, 0.5, 10.0)
        return m["cov_selected"] > 0

    first = pick(0)
    assert int(first.sum()) == int(0.1 * n)  # floor(ratio x trained tokens)
    assert not (first & ~candidates).any()  # only in-range trained tokens
    assert torch.equal(first, pick(0))  # torch's generator decides
    assert not all(torch.equal(first, pick(s)) for s in range(1, 6))


def test_clip_cov_ignores_padding_and_works_on_an_empty_micro_batch():
    logp, adv, mask = _cov_case()
    # a padded fifth token with garbage that would otherwise shift the means and qualify
    logp5 = torch.cat([logp.detach(), torch.tensor([[40.0]])], 1).requires_grad_()
    adv5 = torch.cat([adv, torch.tensor([[3.0]])], 1)
    mask5 = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, metrics = clip_cov_loss(logp5, logp5.detach(), adv5, mask5, 0.2, 0.2, 0.02, 1, 5)
    assert metrics["cov_selected"].tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    torch.testing.assert_close(loss[:, :4], -adv)
    empty, metrics = clip_cov_loss(
        logp, logp.detach(), adv, torch.zeros(1, 4), 0.2, 0.2, 0.02, 1, 5
    )
    assert not metrics["cov_selected"].any() and torch.isfinite(empty).all()


# ---- KL-Cov ---------------------------------------------------------------------------------


def test_kl_cov_hand_example():
    # log pi -1, -3, -2, -2 (mean -2) ; A 2, -1, 0, -1 (mean 0) ; covariances 2, 1, 0, 0
    logp = torch.tensor([[-1.0, -3.0, -2.0, -2.0]], requires_grad=True)
    adv = torch.tensor([[2.0, -1.0, 0.0, -1.0]])
    old = logp.detach() - torch.tensor([[0.5, 0.5, 0.0, 0.0]])  # log-ratios 0.5, 0.5, 0, 0
    # 0.25 x 4 = 1 token: the top covariance, token 0
    loss, metrics = kl_cov_loss(logp, old, adv, torch.ones(1, 4), cov_ratio=0.25, coef=1.0)
    e = math.exp(0.5)
    # token 0: -2 e^0.5 + |0.5| ; token 1: +e^0.5 ; token 2: 0 ; token 3: +1 (ratio 1, A -1)
    torch.testing.assert_close(loss, torch.tensor([[-2 * e + 0.5, e, 0.0, 1.0]]))
    assert metrics["cov_selected"].tolist() == [[1.0, 0.0, 0.0, 0.0]]
    # gradients -A r, plus coef * sign(log-ratio) on token 0
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[-2 * e + 1.0, e, 0.0, 1.0]]))


def test_kl_cov_at_ratio_one_equals_policy_gradient():
    torch.manual_seed(6)
    logp = torch.randn(4, 8, requires_grad=True)
    adv = torch.randn(4, 1).expand(4, 8)
    mask = torch.ones(4, 8)
    loss, metrics = kl_cov_loss(logp, logp.detach(), adv, mask, cov_ratio=0.2, coef=1.0)
    assert int(metrics["cov_selected"].sum()) == int(0.2 * 32)  # penalised, but at ratio 1...
    torch.testing.assert_close(loss, -adv)  # ...the penalty is 0 with zero gradient
    torch.testing.assert_close(_grad(loss, logp), _pg_grad(logp, adv))


def test_kl_cov_penalises_the_top_covariance_trained_tokens_only():
    torch.manual_seed(7)
    logp = torch.randn(6, 10)
    adv = torch.randn(6, 1).expand(6, 10)
    mask = (torch.rand(6, 10) > 0.3).float()
    logp[mask == 0] = 100.0  # garbage on padding: would top any covariance if counted
    _, metrics = kl_cov_loss(logp, logp - 0.1, adv, mask, cov_ratio=0.1, coef=1.0)
    selected = metrics["cov_selected"] > 0
    n = int(mask.sum())
    assert int(selected.sum()) == max(1, int(0.1 * n))
    cov = token_covariance(logp, adv, mask)
    trained = mask > 0
    assert not (selected & ~trained).any()
    assert cov[selected].min() >= cov[trained & ~selected].max()
    # the paper's 2e-4 would round to nothing here: at least one token is penalised
    _, metrics = kl_cov_loss(logp, logp - 0.1, adv, mask, cov_ratio=2e-4, coef=1.0)
    assert int(metrics["cov_selected"].sum()) == 1


# ---- all five: registry, extreme inputs, the objective and the config ------------------------


def test_the_new_losses_are_registered_with_their_traits():
    assert set(NEW_LOSSES) <= set(POLICY_LOSSES.names(ratio=True))
    assert POLICY_LOSSES.names(dual_clip=True) == ["clip_cov", "ppo_clip"]


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_extreme_log_ratios_and_padding_stay_finite(name):
    torch.manual_seed(8)
    logp = (30.0 * torch.randn(4, 6)).requires_grad_()  # log-ratios far beyond +-20
    old = -30.0 * torch.rand(4, 6)
    adv = 5.0 * torch.randn(4, 1).expand(4, 6)
    mask = torch.ones(4, 6)
    mask[:, 4:] = 0.0
    x = PolicyLossInputs(logp, old, adv, mask)
    settings = POLICY_LOSSES.settings(name)
    given = {"clip_low": 0.4, "clip_high": 0.4, "cov_ratio": 0.2}
    own = {f.name for f in dataclasses.fields(settings)}
    loss, metrics = POLICY_LOSSES.get(name)(x, settings(**{k: given[k] for k in own & set(given)}))
    assert loss.shape == (4, 6) and torch.isfinite(loss).all()
    assert all(torch.isfinite(v).all() and not v.requires_grad for v in metrics.values())
    grad = _grad(loss, logp, mask)
    assert torch.isfinite(grad).all()
    assert torch.all(grad[:, 4:] == 0)  # padding never gets a gradient


def test_policy_objective_passes_the_new_settings_to_the_losses():
    logp = torch.tensor([[-1.0, -3.0, -2.0, -2.0]])
    batch = {
        "old_logprobs": logp - torch.tensor([[0.5, 0.5, 0.0, 0.0]]),
        "advantages": torch.tensor([[2.0, -1.0, 0.0, -1.0]]),
        "loss_mask": torch.ones(1, 4),
    }
    kl, _ = PolicyObjective("kl_cov", KLCovSettings(cov_ratio=0.25, coef=3.0))(
        {"logprobs": logp}, batch
    )
    e = math.exp(0.5)
    torch.testing.assert_close(kl, torch.tensor([[-2 * e + 1.5, e, 0.0, 1.0]]))  # 3 x 0.5
    sapo, _ = PolicyObjective("sapo", SapoSettings(tau_pos=2.0, tau_neg=4.0))(
        {"logprobs": logp}, {**batch, "old_logprobs": logp}
    )
    # ratio 1: -A * 2 / tau -> -2 (tau 2), +0.5 (tau 4), 0, +0.5
    torch.testing.assert_close(sapo, torch.tensor([[-2.0, 0.5, 0.0, 0.5]]))


def test_recipe_maps_the_new_config_keys():
    """The flat keys reach the settings of the loss that reads them (each loss has its own)."""
    keys = dict(
        sapo_tau_pos=0.5,
        sapo_tau_neg=2.5,
        cov_ratio=0.1,
        clip_cov_low=0.5,
        clip_cov_high=8.0,
        kl_cov_coef=0.3,
    )

    def settings(loss):
        cfg = AlgorithmConfig(policy_loss=loss, **keys)
        objective = Recipe(cfg, group_size=4, max_new_tokens=8).policy_objective()
        assert objective.policy_loss == loss
        return objective.loss_settings

    clip_cov, sapo, kl_cov = settings("clip_cov"), settings("sapo"), settings("kl_cov")
    got = (
        "clip_cov",
        sapo.tau_pos,
        sapo.tau_neg,
        clip_cov.cov_ratio,
        clip_cov.cov_low,
        clip_cov.cov_high,
        kl_cov.coef,
    )
    assert got == ("clip_cov", 0.5, 2.5, 0.1, 0.5, 8.0, 0.3)
    assert kl_cov.cov_ratio == 0.1


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"sapo_tau_pos": 0.0}, "algorithm.sapo_tau_pos=0.0"),
        ({"sapo_tau_neg": -1.0}, "algorithm.sapo_tau_neg=-1.0"),
        ({"cov_ratio": 0.0}, "algorithm.cov_ratio=0.0"),
        ({"cov_ratio": 1.5}, "algorithm.cov_ratio=1.5"),
        ({"clip_cov_low": 6.0}, "algorithm.clip_cov_low=6.0 exceeds algorithm.clip_cov_high"),
        ({"kl_cov_coef": -0.1}, "algorithm.kl_cov_coef=-0.1"),
        ({"policy_loss": "gmpo", "dual_clip": 3.0}, "algorithm.dual_clip=null"),
    ],
)
def test_bad_values_of_the_new_keys_name_the_key(kwargs, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        resolve(TrainConfig(algorithm=AlgorithmConfig(**kwargs)))


def test_clip_cov_accepts_the_dual_clip():
    assert AlgorithmConfig(policy_loss="clip_cov", dual_clip=3.0).dual_clip == 3.0


@pytest.mark.parametrize(
    "name,settings",
    [
        ("cispo", {"clip_eps": 1.0, "clip_eps_high": 5.0, "loss_agg": "token_mean"}),
        ("gmpo", {"clip_eps": 0.4, "clip_eps_high": 0.4, "loss_agg": "seq_mean_token_mean"}),
        (
            "sapo",
            {"sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05, "loss_agg": "seq_mean_token_mean"},
        ),
        ("clip_cov", {"clip_eps": 1.0, "cov_ratio": 0.02, "clip_cov_high": 5.0}),
        ("kl_cov", {"cov_ratio": 0.02, "kl_cov_coef": 1.0, "loss_agg": "token_mean"}),
    ],
)
def test_presets_set_their_loss_and_train_a_step(name, settings):
    cfg = load_config([f"algorithm={name}"])
    algo = cfg.algorithm
    assert algo.name == name and algo.policy_loss == name and algo.advantage == "grpo"
    assert algo.kl_coef == 0.0 and has_ratio(algo)
    for key, value in settings.items():
        assert getattr(algo, key) == value, key
    # the preset's objective on a small batch, a second optimizer step's worth off-policy
    torch.manual_seed(9)
    logp = torch.randn(4, 5, requires_grad=True)
    batch = {
        "old_logprobs": logp.detach() + 0.1 * torch.randn(4, 5),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(4, 5),
        "loss_mask": torch.ones(4, 5),
    }
    objective = Recipe(algo, group_size=4, max_new_tokens=5).policy_objective()
    loss, _ = objective({"logprobs": logp}, batch)
    grad = _grad(loss, logp, batch["loss_mask"], objective.loss_agg)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
