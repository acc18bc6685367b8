"""Advantages, losses, aggregation, KL and shaping against hand-computed examples, plus the
invariants and shape/mask properties every algorithm relies on."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsys.algorithms import advantages as A
from rlsys.algorithms.estimators import (
    ADVANTAGES,
    AdvantageInputs,
    DiscountSettings,
    GaeSettings,
)
from rlsys.algorithms.kl import adaptive_kl_coef, kl_estimate
from rlsys.algorithms.losses import (
    LOSS_AGGREGATIONS,
    aggregate,
    gspo_loss,
    loss_weights,
    nll_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    value_loss,
)
from rlsys.algorithms.objectives import PolicyObjective, ValueObjective
from rlsys.algorithms.offpolicy import importance_weights
from rlsys.algorithms.shaping import overlong_buffer_len, overlong_penalty

# ---- advantage estimators ------------------------------------------------------------------


def test_grpo_advantages_hand_example():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = A.grpo_advantages(rewards, eps=0.0)
    # group 0: mean 0.5, unbiased std sqrt(1/3)
    s0 = math.sqrt(1 / 3)
    np.testing.assert_allclose(adv[0], [0.5 / s0, -0.5 / s0, -0.5 / s0, 0.5 / s0], rtol=1e-6)
    # group 1: mean 0.75, unbiased std 0.5
    np.testing.assert_allclose(adv[1], [0.5, 0.5, 0.5, -1.5], rtol=1e-6)


def test_grpo_uniform_groups_are_zero():
    rewards = np.ones((2, 4))
    assert np.all(A.grpo_advantages(rewards) == 0)


def test_dr_grpo_is_centred_rewards():
    rewards = np.array([[2.0, 0.0, 1.0]])
    np.testing.assert_allclose(A.dr_grpo_advantages(rewards), [[1.0, -1.0, 0.0]])
    np.testing.assert_allclose(A.grpo_advantages(rewards, normalize_std=False), [[1.0, -1.0, 0]])


def test_rloo_hand_example():
    # sample 0: others (0, 0, 1) mean 1/3 -> 2/3; sample 1: others (1, 0, 1) mean 2/3 -> -2/3
    adv = A.rloo_advantages(np.array([[1.0, 0.0, 0.0, 1.0]]))
    np.testing.assert_allclose(adv, [[2 / 3, -2 / 3, -2 / 3, 2 / 3]], rtol=1e-6)
    with pytest.raises(ValueError, match="2 samples"):
        A.rloo_advantages(np.array([[1.0]]))


def test_remax_subtracts_the_greedy_reward():
    np.testing.assert_allclose(
        A.remax_advantages(np.array([1.0, 0.0, 1.0]), np.array([1.0, 1.0, 0.0])), [0, -1, 1]
    )


MASK = np.array(
    [
        [0, 1, 1, 1, 0],  # response of 3 tokens, right padding
        [0, 0, 1, 1, 1],  # response of 3 tokens ending at the last position
        [0, 1, 0, 1, 0],  # an environment token (mask 0) inside the response
    ],
    dtype=np.float32,
)


def test_last_token_rewards_land_on_the_last_trained_token():
    out = A.last_token_rewards(np.array([1.0, 2.0, 3.0]), MASK)
    expected = np.zeros_like(MASK)
    expected[0, 3], expected[1, 4], expected[2, 3] = 1.0, 2.0, 3.0
    np.testing.assert_array_equal(out, expected)


def test_discounted_returns_hand_example_skips_masked_tokens():
    rewards = np.array([[0, 1.0, 0, 2.0, 9.0]] * 3, dtype=np.float32)
    out = A.discounted_returns(rewards, MASK, gamma=0.5)
    # row 0: G3 = 2, G2 = 0 + 0.5 * 2 = 1, G1 = 1 + 0.5 * 1 = 1.5
    np.testing.assert_allclose(out[0], [0, 1.5, 1.0, 2.0, 0])
    # row 1: G4 = 9, G3 = 2 + 4.5 = 6.5, G2 = 0 + 3.25
    np.testing.assert_allclose(out[1], [0, 0, 3.25, 6.5, 9.0])
    # row 2: the masked token at 2 is skipped: G3 = 2, G1 = 1 + 0.5 * 2 = 2
    np.testing.assert_allclose(out[2], [0, 2.0, 0, 2.0, 0])


def test_whiten_uses_masked_entries_only():
    values = np.array([[100.0, 1.0, 3.0]])
    mask = np.array([[0.0, 1.0, 1.0]])
    np.testing.assert_allclose(A.whiten(values, mask), [[0.0, -1.0, 1.0]], atol=1e-6)


def test_reinforce_pp_whitens_returns_over_the_batch():
    rewards = A.last_token_rewards(np.array([1.0, 0.0]), MASK[:2])
    adv = A.reinforce_pp_advantages(rewards, MASK[:2])
    # returns: row 0 all 1, row 1 all 0 -> mean 0.5, std 0.5 -> +1 / -1
    np.testing.assert_allclose(adv[0], [0, 1, 1, 1, 0], atol=1e-6)
    np.testing.assert_allclose(adv[1], [0, 0, -1, -1, -1], atol=1e-6)


def test_gae_hand_examples():
    mask = np.array([[1.0, 1.0, 1.0]])
    rewards = np.array([[0.0, 0.0, 1.0]])
    values = np.array([[0.2, 0.5, 0.8]])
    # lambda 1, gamma 1: A_t = R - V_t (Monte Carlo)
    adv, ret = A.gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [[0.8, 0.5, 0.2]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]], rtol=1e-6)
    # lambda 0: one-step TD errors r_t + V_{t+1} - V_t, V after the end = 0
    adv, _ = A.gae_advantages(rewards, values, mask, gamma=1.0, lam=0.0)
    np.testing.assert_allclose(adv, [[0.3, 0.3, 0.2]], rtol=1e-6)
    # gamma 0.9, lambda 0.5: delta = (0.25, 0.22, 0.2); A2 = 0.2, A1 = 0.22 + 0.45 * 0.2,
    # A0 = 0.25 + 0.45 * A1
    adv, _ = A.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    a1 = 0.22 + 0.45 * 0.2
    np.testing.assert_allclose(adv, [[0.25 + 0.45 * a1, a1, 0.2]], rtol=1e-6)


def test_gae_skips_environment_tokens_and_ignores_padding():
    rewards = np.array([[0.0, 0.0, 1.0]])
    values = np.array([[0.2, 0.5, 0.8]])
    plain, _ = A.gae_advantages(rewards, values, np.ones((1, 3)), 0.9, 0.5)
    # insert an environment token (mask 0, arbitrary reward and value) and padding
    rewards_env = np.array([[5.0, 0.0, 7.0, 0.0, 1.0, 3.0]])
    values_env = np.array([[4.0, 0.2, 9.0, 0.5, 0.8, 6.0]])
    mask_env = np.array([[0, 1, 0, 1, 1, 0.0]])
    adv, ret = A.gae_advantages(rewards_env, values_env, mask_env, 0.9, 0.5)
    np.testing.assert_allclose(adv[0, [1, 3, 4]], plain[0], rtol=1e-6)
    assert adv[0, [0, 2, 5]].tolist() == [0, 0, 0] and ret[0, [0, 2, 5]].tolist() == [0, 0, 0]


def test_the_builtin_estimators_are_registered_with_their_traits():
    assert ADVANTAGES.names() == [
        "dr_grpo",
        "gae",
        "gigpo",
        "gpg",
        "grpo",
        "opo",
        "pass_at_k",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "remax",
        "rloo",
        "treepo",
        "treerl",
    ]
    assert ADVANTAGES.names(group=True) == [
        "dr_grpo",
        "gigpo",
        "gpg",
        "grpo",
        "opo",
        "pass_at_k",
        "reinforce_pp_baseline",
        "rloo",
        "treepo",
        "treerl",
    ]
    assert ADVANTAGES.names(needs_critic=True) == ["gae"]
    assert ADVANTAGES.names(greedy_baseline=True) == ["remax"]
    assert ADVANTAGES.names(tree=True) == ["treepo", "treerl"]
    assert ADVANTAGES.names(multi_turn=True) == ["gigpo"]


def test_outcome_estimators_add_the_kl_penalty_reward_to_go():
    mask = np.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    penalty = np.array([[0.1, 0.2, 0.3], [0.4, 0.5, 0.0]])
    inputs = AdvantageInputs(
        rewards=np.array([1.0, 0.0]), mask=mask, group_size=2, kl_penalty=penalty
    )
    adv = ADVANTAGES.get("dr_grpo")(inputs, DiscountSettings()).advantages
    # dr_grpo: +0.5 / -0.5, minus the penalty still to come from each token on
    np.testing.assert_allclose(adv[0], [0.5 - 0.6, 0.5 - 0.5, 0.5 - 0.3], rtol=1e-6)
    np.testing.assert_allclose(adv[1], [-0.5 - 0.9, -0.5 - 0.5, 0.0], rtol=1e-6)


def test_gae_estimator_returns_value_targets_and_needs_values():
    mask = np.ones((2, 2))
    inputs = AdvantageInputs(
        rewards=np.array([1.0, 0.0]), mask=mask, group_size=1, values=np.zeros((2, 2))
    )
    out = ADVANTAGES.get("gae")(inputs, GaeSettings(lam=1.0))
    np.testing.assert_allclose(out.advantages, [[1, 1], [0, 0]])
    np.testing.assert_allclose(out.returns, [[1, 1], [0, 0]])
    with pytest.raises(ValueError, match="values"):
        ADVANTAGES.get("gae")(AdvantageInputs(np.array([1.0]), np.ones((1, 2)), 1), GaeSettings())
    with pytest.raises(ValueError, match="baseline"):
        ADVANTAGES.get("remax")(
            AdvantageInputs(np.array([1.0]), np.ones((1, 2)), 1), DiscountSettings()
        )


def test_reinforce_pp_baseline_subtracts_the_group_mean_first():
    mask = np.ones((4, 1))
    rewards = np.array([1.0, 1.0, 0.0, 1.0])  # group means 1 and 0.5
    out = ADVANTAGES.get("reinforce_pp_baseline")(
        AdvantageInputs(rewards, mask, 2), DiscountSettings()
    )
    # centred: 0, 0, -0.5, 0.5 -> mean 0, std sqrt(0.125)
    np.testing.assert_allclose(out.advantages[:, 0], np.array([0, 0, -1, 1]) * math.sqrt(2))


# ---- policy and value losses ----------------------------------------------------------------


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


def test_dual_clip_bounds_negative_advantage_losses_only():
    old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[5.0, 5.0]]))  # ratio 5
    adv = torch.tensor([[-1.0, 1.0]])
    plain, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2)
    dual, metrics = ppo_clip_loss(logp, old, adv, 0.2, 0.2, dual_clip=3.0)
    # A<0: max(5, 1.2) = 5 -> bounded by 3 ; A>0: min(5, 1.2) -> -1.2 untouched
    torch.testing.assert_close(plain, torch.tensor([[5.0, -1.2]]))
    torch.testing.assert_close(dual, torch.tensor([[3.0, -1.2]]))
    assert metrics["dual_clipped"].tolist() == [[1.0, 0.0]]


def test_ppo_with_ratio_one_equals_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    adv = torch.randn(3, 5)
    loss, _ = ppo_clip_loss(logp, logp.detach(), adv, 0.2, 0.2)
    torch.testing.assert_close(loss, -adv)  # the surrogate's value at ratio 1 is -A
    loss.sum().backward()
    pg, _ = policy_gradient_loss(logp, adv)
    pg_grad = torch.autograd.grad(pg.sum(), logp)[0]
    torch.testing.assert_close(logp.grad, pg_grad)


def test_clip_higher_uses_its_own_upper_range():
    old = torch.zeros(1, 1)
    logp = torch.log(torch.tensor([[1.25]]))
    adv = torch.ones(1, 1)
    loss_sym, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2)
    loss_high, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.28)
    assert loss_sym.item() == pytest.approx(-1.2)
    assert loss_high.item() == pytest.approx(-1.25)


def test_gspo_uses_one_clipped_sequence_ratio():
    old = torch.zeros(2, 3)
    # row 0: token log-ratios 0.1, 0.3 (mean 0.2); row 1: 0.0, 0.0, 0.003 (mean 0.001)
    logp = torch.tensor([[0.1, 0.3, 0.0], [0.0, 0.0, 0.003]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0], [-1.0]]).expand(2, 3)
    loss, metrics = gspo_loss(logp, old, adv, mask, 3e-4, 4e-4)
    # row 0: s = e^0.2 clipped to 1.0004 -> -1.0004 ; row 1: s = e^0.001, A<0: max(s, clip)
    s1 = math.exp(0.001)
    torch.testing.assert_close(loss[0, :2], torch.full((2,), -1.0004))
    torch.testing.assert_close(loss[1], torch.full((3,), s1))
    assert metrics["clipped"][0, :2].tolist() == [1.0, 1.0]
    # gradient of row 1 (unclipped) under seq_mean_token_mean: s * |A| / |y| / num_seqs
    aggregate(loss, mask, "seq_mean_token_mean").backward()
    torch.testing.assert_close(logp.grad[1], torch.full((3,), s1 / 3 / 2))
    assert torch.all(logp.grad[0] == 0)  # clipped: no gradient


def test_gspo_at_ratio_one_has_the_sequence_mean_policy_gradient():
    torch.manual_seed(1)
    logp = torch.randn(4, 6, requires_grad=True)
    mask = (torch.rand(4, 6) > 0.3).float()
    mask[:, 0] = 1.0
    adv = torch.randn(4, 1).expand(4, 6)
    loss, _ = gspo_loss(logp, logp.detach(), adv, mask, 0.2, 0.2)
    grad = torch.autograd.grad(aggregate(loss, mask, "seq_mean_token_mean"), logp)[0]
    pg, _ = policy_gradient_loss(logp, adv)
    pg_grad = torch.autograd.grad(aggregate(pg, mask, "seq_mean_token_mean"), logp)[0]
    torch.testing.assert_close(grad, pg_grad)


def test_clipped_value_loss_hand_example():
    values = torch.tensor([[1.5, 1.1]])
    old = torch.tensor([[1.0, 1.0]])
    returns = torch.tensor([[2.0, 2.0]])
    loss, metrics = value_loss(values, old, returns, clip=0.2)
    # token 0: (1.5-2)^2 = 0.25 vs clipped 1.2: 0.64 -> 0.32 ; token 1: within the clip
    torch.testing.assert_close(loss, torch.tensor([[0.32, 0.5 * 0.81]]))
    assert metrics["value_clipped"].tolist() == [[1.0, 0.0]]
    plain, _ = value_loss(values, old, returns, clip=None)
    torch.testing.assert_close(plain, torch.tensor([[0.125, 0.405]]))


# ---- aggregation ------------------------------------------------------------------------------


def test_loss_aggregations_hand_example():
    per_token = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token_mean").item() == pytest.approx(2.0)  # 6 / 3
    assert aggregate(per_token, mask, "seq_mean_token_sum").item() == pytest.approx(3.0)
    assert aggregate(per_token, mask, "seq_mean_token_mean").item() == pytest.approx(2.25)
    assert aggregate(per_token, mask, "seq_sum_norm", norm=4).item() == pytest.approx(0.75)
    assert torch.equal(nll_loss(torch.tensor([-0.5])), torch.tensor([0.5]))
    with pytest.raises(ValueError, match="norm"):
        aggregate(per_token, mask, "seq_sum_norm")
    with pytest.raises(ValueError, match="loss_agg"):
        aggregate(per_token, mask, "median")


def _masks(draw_rows: int, draw_cols: int):
    return st.lists(
        st.lists(st.booleans(), min_size=draw_cols, max_size=draw_cols),
        min_size=draw_rows,
        max_size=draw_rows,
    )


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 7),
    mode=st.sampled_from(LOSS_AGGREGATIONS.names()),
    shards=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_sharded_aggregation_equals_whole_batch_and_ignores_padding(rows, cols, mode, shards, seed):
    gen = torch.Generator().manual_seed(seed)
    per_token = torch.randn(rows, cols, generator=gen)
    mask = (torch.rand(rows, cols, generator=gen) > 0.4).float()
    whole = aggregate(per_token, mask, mode, norm=5.0)
    tokens, seqs = float(mask.sum()), float((mask.sum(-1) > 0).sum())
    parts = [
        (per_token[idx] * loss_weights(mask[idx], mode, tokens, seqs, 5.0)).sum()
        for idx in np.array_split(np.arange(rows), shards)
    ]
    torch.testing.assert_close(sum(parts), whole)
    # whatever sits on padding (mask 0) changes nothing
    noisy = torch.where(mask > 0, per_token, torch.full_like(per_token, 1e6))
    torch.testing.assert_close(aggregate(noisy, mask, mode, norm=5.0), whole)


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 5), n=st.integers(2, 8), seed=st.integers(0, 10_000))
def test_group_advantages_sum_to_zero_for_any_shape(groups, n, seed):
    rewards = np.random.default_rng(seed).integers(0, 3, size=(groups, n)).astype(float)
    for adv in (
        A.grpo_advantages(rewards),
        A.dr_grpo_advantages(rewards),
        A.rloo_advantages(rewards),
    ):
        assert adv.shape == rewards.shape
        np.testing.assert_allclose(adv.sum(axis=1), 0.0, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_token_estimators_are_zero_off_the_mask_for_any_mask(rows, cols, seed):
    rng = np.random.default_rng(seed)
    mask = (rng.random((rows, cols)) > 0.4).astype(np.float32)
    rewards = rng.random(rows)
    values = rng.random((rows, cols))
    inputs = AdvantageInputs(rewards, mask, 1, kl_penalty=rng.random((rows, cols)), values=values)
    inputs.baseline_rewards = rng.random(rows)
    for name in ("remax", "reinforce_pp", "gae"):
        out = ADVANTAGES.get(name)(inputs, ADVANTAGES.settings(name)())
        assert out.advantages.shape == mask.shape
        assert np.all(out.advantages[mask == 0] == 0), name
        assert np.all(np.isfinite(out.advantages)), name
    whitened = A.whiten(rng.random((rows, cols)), mask)
    if mask.sum() > 1:
        assert abs(whitened[mask > 0].mean()) < 1e-5


# ---- KL, objectives, shaping -----------------------------------------------------------------


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


def test_one_extreme_token_moves_the_kl_term_by_at_most_the_clamp():
    # log r = ref - logp = 8: k3 unclamped is e^8 - 9 = 2,972
    logp = torch.tensor([0.0, -8.0, -0.1], requires_grad=True)
    ref = torch.tensor([-0.1, 0.0, 0.0])
    assert kl_estimate(logp, ref, "k3", clamp=None)[1].item() == pytest.approx(math.exp(8) - 9)
    kl = kl_estimate(logp, ref, "k3")  # default clamp 10
    assert kl[1].item() == 10.0
    kl.sum().backward()
    assert logp.grad[1] == 0.0 and logp.grad[0] != 0.0  # beyond the clamp: no gradient
    # under the clamp the estimators are untouched
    assert kl[0].item() == pytest.approx(math.exp(-0.1) - 1 + 0.1, rel=1e-5)
    for kind in ("k1", "k2", "k3"):
        extreme = kl_estimate(torch.tensor([-20.0]), torch.tensor([0.0]), kind, clamp=10.0)
        assert abs(extreme.item()) <= 10.0


def test_a_stale_sequence_moves_the_gspo_loss_by_at_most_its_clamp():
    # a sample 15 nats more likely now than when generated, negative advantage: the unclipped
    # side is -A * e^15 (3.3e6) without the guard
    old = torch.zeros(1, 2)
    logp = torch.full((1, 2), 15.0, requires_grad=True)
    mask, adv = torch.ones(1, 2), torch.full((1, 2), -1.0)
    loss, _ = gspo_loss(logp, old, adv, mask, 3e-4, 4e-4)  # default clamp 10
    torch.testing.assert_close(loss, torch.full((1, 2), math.exp(10.0)))
    loss.sum().backward()
    assert torch.all(logp.grad == 0)  # beyond the clamp: no gradient
    loose, _ = gspo_loss(logp.detach(), old, adv, mask, 3e-4, 4e-4, log_ratio_clamp=20.0)
    torch.testing.assert_close(loose, torch.full((1, 2), math.exp(15.0)))


def test_k3_is_an_unbiased_kl_estimate():
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.2, 0.5, 0.3])
    exact = float((p * (p / q).log()).sum())
    expected_k3 = float((p * kl_estimate(p.log(), q.log(), "k3")).sum())
    assert expected_k3 == pytest.approx(exact, rel=1e-5)


def test_adaptive_kl_coefficient_moves_towards_the_target():
    # KL twice the target: error clipped to +0.2, scaled by 100 / 1000 samples
    assert adaptive_kl_coef(0.1, 2.0, 1.0, 100, 1000) == pytest.approx(0.1 * 1.02)
    assert adaptive_kl_coef(0.1, 0.95, 1.0, 100, 1000) == pytest.approx(0.1 * (1 - 0.005))
    assert adaptive_kl_coef(0.1, float("nan"), 1.0, 100, 1000) == 0.1


def test_policy_objective_adds_kl_and_entropy_terms():
    out = {"logprobs": torch.zeros(1, 2), "entropy": torch.full((1, 2), 2.0)}
    batch = {
        "old_logprobs": torch.zeros(1, 2),
        "advantages": torch.ones(1, 2),
        "ref_logprobs": torch.full((1, 2), math.log(0.5)),
        "loss_mask": torch.ones(1, 2),
    }
    plain, _ = PolicyObjective()(out, batch)
    full, metrics = PolicyObjective(kl_coef=0.1, entropy_coef=0.01)(out, batch)
    k3 = 0.5 - 1 - math.log(0.5)
    torch.testing.assert_close(full, plain + 0.1 * k3 - 0.01 * 2.0)
    assert "kl_ref" in metrics
    gspo, _ = PolicyObjective(policy_loss="gspo")(out, batch)
    torch.testing.assert_close(gspo, plain)  # ratio 1, A = 1: -1 per token
    vanilla, _ = PolicyObjective(policy_loss="vanilla")(out, batch)
    torch.testing.assert_close(vanilla, torch.zeros(1, 2))  # -A * log pi with log pi = 0
    with pytest.raises(ValueError, match="policy_loss"):
        PolicyObjective(policy_loss="trpo")(out, batch)


def test_value_objective_regresses_onto_returns():
    loss, _ = ValueObjective(clip=None)(
        {"values": torch.tensor([[1.0]])},
        {"values": torch.tensor([[1.0]]), "returns": torch.tensor([[3.0]])},
    )
    assert loss.item() == pytest.approx(2.0)


def test_overlong_penalty_hand_example():
    # budget 10, buffer 4: no penalty up to 6 tokens, then -1/4 per token, -1 at 10 and beyond
    lengths = np.array([3, 6, 7, 8, 10, 12])
    np.testing.assert_allclose(overlong_penalty(lengths, 10, 4), [0, 0, -0.25, -0.5, -1, -1])
    np.testing.assert_allclose(overlong_penalty(lengths, 10, 4, factor=0.5)[-1], -0.5)
    assert not overlong_penalty(lengths, 10, 0).any()
    assert overlong_buffer_len(20480, 0.2) == 4096
    assert overlong_buffer_len(4, 0.2) == 0  # too short a budget: off


# ---- off-policy correction ------------------------------------------------------------------


def _offpolicy_case():
    # ratios pi_old / pi_behaviour of 1, e (2.72), 0.5 on trained tokens; the last is padding
    behaviour = np.log(np.array([[0.5, 0.1, 0.4, 0.3]], dtype=np.float32))
    old = np.log(np.array([[0.5, 0.1 * math.e, 0.2, 0.9]], dtype=np.float32))
    mask = np.array([[1, 1, 1, 0]], dtype=np.float32)
    return old, behaviour, mask


def test_truncated_importance_sampling_caps_the_ratio():
    old, behaviour, mask = _offpolicy_case()
    weights, metrics = importance_weights(old, behaviour, mask, "tis", cap=2.0)
    np.testing.assert_allclose(weights, [[1.0, 2.0, 0.5, 0.0]], rtol=1e-5)
    assert metrics["offpolicy/capped_frac"] == pytest.approx(1 / 3)
    assert metrics["offpolicy/ratio_max"] == pytest.approx(math.e, rel=1e-5)
    assert metrics["offpolicy/ratio_mean"] == pytest.approx((1 + math.e + 0.5) / 3, rel=1e-5)


def test_decoupled_ppo_rejects_tokens_over_the_cap():
    old, behaviour, mask = _offpolicy_case()
    weights, metrics = importance_weights(old, behaviour, mask, "decoupled", cap=2.0)
    np.testing.assert_allclose(weights, [[1.0, 0.0, 0.5, 0.0]], rtol=1e-5)
    assert metrics["offpolicy/weight_mean"] == pytest.approx(0.5, rel=1e-5)


def test_no_correction_still_reports_the_mismatch():
    old, behaviour, mask = _offpolicy_case()
    weights, metrics = importance_weights(old, behaviour, mask, "none", cap=2.0)
    assert weights is None
    assert metrics["offpolicy/weight_mean"] == 1.0
    assert metrics["offpolicy/ratio_max"] == pytest.approx(math.e, rel=1e-5)
    with pytest.raises(ValueError, match="algorithm.off_policy"):
        importance_weights(old, behaviour, mask, "is", cap=2.0)


def test_policy_objective_weights_only_the_policy_gradient_term():
    logprobs = torch.tensor([[-1.0, -2.0]])
    batch = {
        "old_logprobs": torch.tensor([[-1.0, -2.0]]),
        "advantages": torch.tensor([[1.0, -1.0]]),
        "ref_logprobs": torch.tensor([[-1.5, -2.0]]),
        "loss_mask": torch.ones(1, 2),  # every policy loss may read it (gspo does)
    }
    objective = PolicyObjective(kl_coef=0.1, kl_estimator="k2")
    plain, _ = objective({"logprobs": logprobs}, batch)
    weighted, _ = objective(
        {"logprobs": logprobs}, {**batch, "is_weights": torch.tensor([[2.0, 0.0]])}
    )
    kl = kl_estimate(logprobs, batch["ref_logprobs"], "k2")
    # ratio 1: the PPO term is -A per token; the KL term is not reweighted
    torch.testing.assert_close(plain, torch.tensor([[-1.0, 1.0]]) + 0.1 * kl)
    torch.testing.assert_close(weighted, torch.tensor([[-2.0, 0.0]]) + 0.1 * kl)
