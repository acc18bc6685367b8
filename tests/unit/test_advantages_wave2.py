"""GPG, OPO and pass@k advantages, the token_sum aggregation and the abs / k1+ / k3+ KL
estimators: hand-computed examples (arithmetic in the comments) and invariants."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from rlsys.algorithms import advantages as A
from rlsys.algorithms.estimators import (
    ADVANTAGES,
    AdvantageInputs,
    DiscountSettings,
    GpgSettings,
)
from rlsys.algorithms.kl import KL_ESTIMATORS, kl_estimate
from rlsys.algorithms.losses import aggregate, loss_weights
from rlsys.algorithms.recipe import Recipe
from rlsys.algorithms.traits import uses_pass_k
from rlsys.config import ConfigError
from rlsys.config.algorithm import AlgorithmConfig
from rlsys.config.schema import RolloutConfig, TrainConfig
from rlsys.resolve import load_config, resolve
from rlsys.types import TrainBatch


def test_the_estimators_are_registered_with_their_traits():
    # the full list of names is checked in tests/unit/test_algorithms.py
    assert {"gpg", "opo", "pass_at_k"} <= set(ADVANTAGES.names(group=True))
    assert ADVANTAGES.names(pass_k=True) == ["pass_at_k"]
    for name in ("gpg", "opo", "pass_at_k"):
        assert not ADVANTAGES.trait(name, "needs_critic")
        assert not ADVANTAGES.trait(name, "greedy_baseline")


# ---- GPG -----------------------------------------------------------------------------------


def test_gpg_hand_example():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    # B = 12 samples, M = 4 in the tied group 1: alpha = 12 / 8 = 1.5
    # group 0: mean 0.5 -> +-0.5 -> +-0.75; group 2: mean 0.25 -> -0.25, 0.75 -> -0.375, 1.125
    adv = A.gpg_advantages(rewards)
    np.testing.assert_allclose(adv[0], [0.75, -0.75, -0.75, 0.75], rtol=1e-6)
    assert np.all(adv[1] == 0.0)
    np.testing.assert_allclose(adv[2], [-0.375, -0.375, -0.375, 1.125], rtol=1e-6)


def test_gpg_without_tied_groups_is_dr_grpo_and_all_tied_is_zero():
    rewards = np.array([[2.0, 0.0, 1.0], [0.3, 0.1, 0.2]])  # M = 0: alpha = 1
    np.testing.assert_allclose(A.gpg_advantages(rewards), A.dr_grpo_advantages(rewards))
    # 0.1 three times: its float mean is not exactly 0.1, the advantage is exactly 0
    tied = np.array([[0.1, 0.1, 0.1], [1.0, 1.0, 1.0]])
    assert np.all(A.gpg_advantages(tied) == 0.0)


def test_gpg_keeps_the_token_mean_gradient_of_informative_groups():
    # Uniform groups kept (gpg, token mean over all B samples) weigh each informative token as
    # dropping them would (dr_grpo, token mean over the B - M others), for equal lengths.
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 2, size=(16, 4)).astype(float)
    rewards[:3] = 1.0  # at least some tied groups
    informative = rewards.max(1) != rewards.min(1)
    length = 5
    kept = A.gpg_advantages(rewards) / (rewards.size * length)
    dropped = A.dr_grpo_advantages(rewards[informative]) / (informative.sum() * 4 * length)
    np.testing.assert_allclose(kept[informative], dropped, rtol=1e-5)


def test_gpg_estimator_broadcasts_over_trained_tokens():
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 1, 1]], np.float32)
    out = ADVANTAGES.get("gpg")(
        AdvantageInputs(np.array([1.0, 0.0, 1.0, 1.0]), mask, 2), GpgSettings()
    )
    # group 0: +-0.5; group 1 tied; alpha = 4 / 2 = 2 -> +-1
    np.testing.assert_allclose(out.advantages, [[1, 1, 0], [-1, 0, 0], [0, 0, 0], [0, 0, 0]])


# ---- OPO -----------------------------------------------------------------------------------


def test_opo_hand_example():
    # lengths 2, 4, 2: b = (2*1 + 4*0 + 2*0) / 8 = 0.25 (the plain mean would be 1/3)
    adv = A.opo_advantages(np.array([[1.0, 0.0, 0.0]]), np.array([[2, 4, 2]]))
    np.testing.assert_allclose(adv, [[0.75, -0.25, -0.25]], rtol=1e-6)
    # lengths 1, 3: b = (1*0 + 3*1) / 4 = 0.75 -> -0.75, 0.25
    adv = A.opo_advantages(np.array([[0.0, 1.0]]), np.array([[1, 3]]))
    np.testing.assert_allclose(adv, [[-0.75, 0.25]], rtol=1e-6)


def test_opo_invariants():
    rng = np.random.default_rng(1)
    rewards = rng.random((6, 5))
    lengths = rng.integers(1, 20, size=(6, 5))
    adv = A.opo_advantages(rewards, lengths)
    # the length-weighted advantages of a group sum to zero
    np.testing.assert_allclose((lengths * adv).sum(1), 0.0, atol=1e-4)
    # equal lengths: the plain group mean (Dr.GRPO's advantage)
    same = A.opo_advantages(rewards, np.full((6, 5), 7))
    np.testing.assert_allclose(same, A.dr_grpo_advantages(rewards), atol=1e-6)
    # a group with no trained token falls back to the plain mean
    none = A.opo_advantages(np.array([[1.0, 0.0]]), np.array([[0, 0]]))
    np.testing.assert_allclose(none, [[0.5, -0.5]])
    with pytest.raises(ValueError, match="lengths"):
        A.opo_advantages(rewards, lengths[:, :2])


def test_opo_estimator_counts_trained_tokens_only():
    # row 0: 3 trained tokens around a masked tool token; row 1: 1 trained token
    mask = np.array([[1, 0, 1, 1], [1, 0, 0, 0]], np.float32)
    out = ADVANTAGES.get("opo")(AdvantageInputs(np.array([1.0, 0.0]), mask, 2), DiscountSettings())
    # b = (3*1 + 1*0) / 4 = 0.75 -> 0.25 and -0.75, on trained tokens only
    np.testing.assert_allclose(out.advantages, [[0.25, 0, 0.25, 0.25], [-0.75, 0, 0, 0]], rtol=1e-6)


# ---- pass@k ----------------------------------------------------------------------------------


def test_pass_at_k_hand_examples():
    # N = 4, k = 2, one correct: fail = C(3,2)/C(4,2) = 3/6 -> R = 0.5, sigma = 0.5
    # correct: 0.5 / 0.5 = 1; incorrect: (0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5 = -1/3
    adv = A.pass_at_k_advantages(np.array([[1.0, 0.0, 0.0, 0.0]]), k=2)
    np.testing.assert_allclose(adv, [[1.0, -1 / 3, -1 / 3, -1 / 3]], rtol=1e-6)
    # two correct: fail = C(2,2)/6 = 1/6, R = 5/6, sigma = sqrt(5/36) = sqrt(5)/6
    # correct: (1/6) / (sqrt(5)/6) = 1/sqrt(5); incorrect: (1/6 - C(1,1)/C(3,1)) / sigma
    # = (1/6 - 2/6) * 6 / sqrt(5) = -1/sqrt(5)
    adv = A.pass_at_k_advantages(np.array([[1.0, 0.0, 1.0, 0.0]]), k=2)
    s = 1 / math.sqrt(5)
    np.testing.assert_allclose(adv, [[s, -s, s, -s]], rtol=1e-6)


def test_pass_at_k_zero_when_the_group_pass_at_k_is_certain():
    rewards = np.array(
        [
            [1.0, 1.0, 1.0, 0.0],  # N_neg = 1 < k = 2: every pair holds a correct one
            [1.0, 1.0, 1.0, 1.0],  # all correct
            [0.0, 0.0, 0.0, 0.0],  # all wrong: R = 0
        ]
    )
    assert np.all(A.pass_at_k_advantages(rewards, k=2) == 0.0)


def test_pass_at_k_with_k_1_is_grpo_with_the_population_std():
    rng = np.random.default_rng(2)
    rewards = rng.integers(0, 2, size=(40, 8)).astype(float)
    mixed = rewards.max(1) != rewards.min(1)
    # R = mean (the pass rate), sigma = sqrt(p (1 - p)) = the population std of 0/1 rewards
    expected = (rewards - rewards.mean(1, keepdims=True)) / rewards.std(1, ddof=0, keepdims=True)
    adv = A.pass_at_k_advantages(rewards, k=1)
    np.testing.assert_allclose(adv[mixed], expected[mixed], rtol=1e-5)
    assert np.all(adv[~mixed] == 0.0)


@pytest.mark.parametrize("n,k", [(4, 2), (5, 3), (6, 2), (8, 4), (8, 7)])
def test_pass_at_k_is_the_mean_advantage_over_the_k_subsets_holding_a_sample(n, k):
    # The analytic form equals, per sample, the mean of (max reward of S - R) / sigma over the
    # k-subsets S that contain it, with R and sigma over all k-subsets: enumerate them.
    for correct in range(n + 1):
        row = np.array([1.0] * correct + [0.0] * (n - correct))
        subsets = list(itertools.combinations(range(n), k))
        passes = {s: float(row[list(s)].max()) for s in subsets}
        r = np.mean(list(passes.values()))
        sigma = math.sqrt(r * (1 - r))
        brute = [
            0.0 if sigma == 0 else np.mean([passes[s] - r for s in subsets if i in s]) / sigma
            for i in range(n)
        ]
        adv = A.pass_at_k_advantages(row[None], k)[0]
        np.testing.assert_allclose(adv, brute, atol=1e-6)
        assert abs(adv.sum()) < 1e-5  # a group's advantages sum to zero


def test_pass_at_k_stays_finite_when_a_group_almost_surely_passes():
    # N = 64, k = 32, 32 wrong: fail = 1 / C(64, 32) ~ 5e-19; in floats R rounds to 1, but the
    # exact counts give the correct sample sqrt(q / (1 - q)) and the wrong one minus as much
    row = np.array([[1.0] * 32 + [0.0] * 32])
    q = 1 / math.comb(64, 32)
    adv = A.pass_at_k_advantages(row, k=32)[0]
    assert np.all(np.isfinite(adv))
    np.testing.assert_allclose(adv[:32], math.sqrt(q / (1 - q)), rtol=1e-5)
    np.testing.assert_allclose(adv[32:], -math.sqrt(q / (1 - q)), rtol=1e-5)


def test_pass_at_k_thresholds_partial_credit_at_one_half():
    # 0.6 passes; 0.5 and 0.4 do not: the same as rewards 1, 0, 0, 0
    partial = A.pass_at_k_advantages(np.array([[0.6, 0.5, 0.4, 0.0]]), k=2)
    binary = A.pass_at_k_advantages(np.array([[1.0, 0.0, 0.0, 0.0]]), k=2)
    np.testing.assert_array_equal(partial, binary)
    with pytest.raises(ValueError, match="pass_k=4"):
        A.pass_at_k_advantages(np.zeros((1, 4)), k=4)
    with pytest.raises(ValueError, match="pass_k=0"):
        A.pass_at_k_advantages(np.zeros((1, 4)), k=0)


def test_pass_at_k_config_and_recipe():
    cfg = AlgorithmConfig(advantage="pass_at_k", pass_k=2)
    mask = np.ones((4, 2), np.float32)
    batch = TrainBatch(
        input_ids=np.zeros((4, 3), np.int64),
        attention_mask=np.ones((4, 3), np.int64),
        loss_mask=mask,
        behaviour_logprobs=np.zeros_like(mask),
        rewards=np.array([1.0, 0.0, 0.0, 0.0], np.float32),
    )
    out = Recipe(cfg, group_size=4, max_new_tokens=2).advantages(batch)
    # the first hand example, broadcast over both tokens: k comes from algorithm.pass_k
    np.testing.assert_allclose(out.advantages[:, 0], [1.0, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)
    np.testing.assert_allclose(out.advantages[:, 1], out.advantages[:, 0])
    with pytest.raises(ConfigError, match="algorithm.pass_k=0"):
        AlgorithmConfig(pass_k=0)
    with pytest.raises(ConfigError, match=r"algorithm.pass_k=8 with rollout.n_samples=8"):
        resolve(TrainConfig(algorithm=AlgorithmConfig(advantage="pass_at_k", pass_k=8)))
    # pass_k matters only to pass_at_k: grpo with 2 samples and the default k = 4 is fine
    TrainConfig(algorithm=AlgorithmConfig(advantage="grpo"), rollout=RolloutConfig(n_samples=2))
    assert uses_pass_k(
        TrainConfig(algorithm=AlgorithmConfig(advantage="pass_at_k", pass_k=7)).algorithm
    )


# ---- presets ---------------------------------------------------------------------------------


def test_presets_set_what_their_papers_use():
    gpg = load_config(["algorithm=gpg"])
    assert (gpg.algorithm.advantage, gpg.algorithm.policy_loss) == ("gpg", "vanilla")
    assert gpg.algorithm.loss_agg == "token_mean" and not gpg.algorithm.filter_uniform_groups
    opo = load_config(["algorithm=opo"])
    assert (opo.algorithm.advantage, opo.algorithm.policy_loss) == ("opo", "vanilla")
    for cfg in (gpg, opo):  # one on-policy optimizer step per batch, no KL
        assert cfg.learner.ppo_epochs == 1 and cfg.learner.num_mini_batches == 1
        assert cfg.algorithm.kl_coef == 0 and not cfg.algorithm.uses_reference
    with pytest.raises(ConfigError, match="learner.ppo_epochs=1"):
        load_config(["algorithm=opo", "learner.ppo_epochs=2"])
    pak = load_config(["algorithm=pass_at_k"])
    assert (pak.algorithm.advantage, pak.algorithm.pass_k, pak.rollout.n_samples) == (
        "pass_at_k",
        4,
        8,
    )
    with pytest.raises(ConfigError, match="rollout.n_samples"):
        load_config(["algorithm=pass_at_k", "rollout.n_samples=4"])


# ---- token_sum -------------------------------------------------------------------------------


def test_token_sum_is_the_plain_sum_over_trained_tokens():
    per_token = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregate(per_token, mask, "token_sum").item() == pytest.approx(6.0)  # 1 + 2 + 3
    # token_mean times the token count (6 / 3 * 3)
    assert aggregate(per_token, mask, "token_sum").item() == pytest.approx(
        aggregate(per_token, mask, "token_mean").item() * 3
    )
    # the weights are the mask whatever the global counts are
    assert torch.equal(loss_weights(mask, "token_sum", 1234.0, 7.0), mask)
    # two shards (ranks or micro-batches) sum to the whole
    halves = sum(aggregate(per_token[i : i + 1], mask[i : i + 1], "token_sum") for i in range(2))
    assert halves.item() == pytest.approx(6.0)


# ---- KL estimators ---------------------------------------------------------------------------


def _grad(kind: str, logp: torch.Tensor, ref: torch.Tensor, clamp: float | None = None):
    logp = logp.clone().requires_grad_(True)
    kl = kl_estimate(logp, ref, kind, clamp=clamp)
    kl.sum().backward()
    return kl.detach(), logp.grad


def test_abs_kl_hand_values_and_sign_gradient():
    # logp = log 0.5, ref = log 0.25: log r = log 0.5 = -0.693 -> |log r| = 0.693; with the
    # reference above the policy the sign flips, the size does not
    logp = torch.tensor([math.log(0.5), math.log(0.25)])
    ref = torch.tensor([math.log(0.25), math.log(0.5)])
    value, grad = _grad("abs", logp, ref)
    torch.testing.assert_close(value, torch.full((2,), math.log(2.0)))
    # d|ref - logp| / dlogp = sign(logp - ref): +1 where pi > ref, -1 where pi < ref
    torch.testing.assert_close(grad, torch.tensor([1.0, -1.0]))
    assert not KL_ESTIMATORS.trait("abs", "zero_mean_grad")


@pytest.mark.parametrize("kind,base", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through_estimators_have_the_value_of_k1_k3_and_the_gradient_of_k2(kind, base):
    gen = torch.Generator().manual_seed(3)
    logp = torch.randn(3, 5, generator=gen)
    ref = torch.randn(3, 5, generator=gen)
    value, grad = _grad(kind, logp, ref)
    base_value, _ = _grad(base, logp, ref)
    _, k2_grad = _grad("k2", logp, ref)
    torch.testing.assert_close(value, base_value)
    torch.testing.assert_close(grad, k2_grad)
    # k2's gradient per token is -log r = logp - ref
    torch.testing.assert_close(grad, logp - ref)
    assert not KL_ESTIMATORS.trait(kind, "zero_mean_grad")


def test_expected_loss_gradients_of_the_new_estimators():
    # Under exact expectation over pi = softmax(theta): k1's gradient is zero, k1+'s and k3+'s
    # that of KL(pi || ref), abs's twice that of the total variation TV(pi, ref).
    theta = torch.tensor([0.3, -0.2, 1.0, 0.1], requires_grad=True)
    ref = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))

    def expected_grad(kind):
        logp = torch.log_softmax(theta, 0)
        weights = logp.exp().detach()  # sampling probabilities: no gradient through them
        (grad,) = torch.autograd.grad((weights * kl_estimate(logp, ref, kind)).sum(), theta)
        return grad

    def exact_grad(fn):
        logp = torch.log_softmax(theta, 0)
        (grad,) = torch.autograd.grad(fn(logp), theta)
        return grad

    kl = exact_grad(lambda logp: (logp.exp() * (logp - ref)).sum())
    tv = exact_grad(lambda logp: 0.5 * (logp.exp() - ref.exp()).abs().sum())
    torch.testing.assert_close(expected_grad("k1"), torch.zeros(4), atol=1e-6, rtol=0)
    torch.testing.assert_close(expected_grad("k1+"), kl)
    torch.testing.assert_close(expected_grad("k3+"), kl)
    torch.testing.assert_close(expected_grad("abs"), 2 * tv)
    # and the values: k1+ / k3+ average to the KL itself, abs to at least the KL
    logp = torch.log_softmax(theta, 0).detach()
    exact = float((logp.exp() * (logp - ref)).sum())
    for kind in ("k1+", "k3+"):
        assert float((logp.exp() * kl_estimate(logp, ref, kind)).sum()) == pytest.approx(exact)
    assert float((logp.exp() * kl_estimate(logp, ref, "abs")).sum()) >= exact


def test_straight_through_clamp_acts_on_the_value():
    # log r = 12: k1 = -12 lies beyond the clamp of 10: clamped value, no gradient
    value, grad = _grad("k1+", torch.tensor([-12.0, -1.0]), torch.tensor([0.0, 0.0]), clamp=10.0)
    torch.testing.assert_close(value, torch.tensor([-10.0, -1.0]))
    torch.testing.assert_close(grad, torch.tensor([0.0, -1.0]))


def test_config_accepts_the_new_estimators_as_a_loss_term():
    for kind in ("abs", "k1+", "k3+"):
        assert AlgorithmConfig(kl_coef=0.1, kl_estimator=kind).uses_reference
    with pytest.raises(ConfigError, match="zero-mean"):
        resolve(TrainConfig(algorithm=AlgorithmConfig(kl_coef=0.1, kl_estimator="k1")))
    assert load_config(["algorithm.kl_estimator=k1+"]).algorithm.kl_estimator == "k1+"
