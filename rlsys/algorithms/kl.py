"""KL to the reference policy: per-token estimators and the adaptive coefficient.

Torch is not imported here (tensor methods only): the config validates
``algorithm.kl_estimator`` against ``KL_ESTIMATORS`` without paying for torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlsys.registry import Registry

if TYPE_CHECKING:
    import torch

# An estimator maps the clamped (B, T-1) log r = ref - logp to the per-token KL estimate.
# Trait: ``zero_mean_grad`` (its gradient has expectation zero: useless as a loss term).
# No form has options of its own, so each registers without settings (``NoSettings``): the
# clamp (algorithm.kl_clamp) bounds every form alike in ``kl_estimate``, and the coefficient
# and where the term goes (kl_coef, kl_penalty) are the recipe's. A form that needed a knob
# would register a settings class as the policy losses do (rlsys.algorithms.settings).
KLEstimator = Callable[["torch.Tensor"], "torch.Tensor"]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator", "algorithm.kl_estimator")


@KL_ESTIMATORS.register("k1", zero_mean_grad=True)
def k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """-log r: unbiased, but negative on some samples and high-variance."""
    return -log_ratio


@KL_ESTIMATORS.register("k2")
def k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """(log r)^2 / 2: biased, non-negative; its gradient is that of KL(pi || ref)."""
    return 0.5 * log_ratio.square()


@KL_ESTIMATORS.register("k3")
def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """r - 1 - log r: unbiased, non-negative, low variance (GRPO's choice)."""
    return log_ratio.exp() - 1.0 - log_ratio


@KL_ESTIMATORS.register("abs")
def abs_kl(log_ratio: torch.Tensor) -> torch.Tensor:
    """|log r|: non-negative, biased upward (E|log r| >= KL(pi || ref)). As a loss term its
    gradient is sign-based, ``sign(log pi - log ref) * grad log pi``, with expectation twice
    the gradient of the total variation distance TV(pi, ref): not zero-mean."""
    return log_ratio.abs()


@KL_ESTIMATORS.register("k1+")
def k1_plus(log_ratio: torch.Tensor) -> torch.Tensor:
    """k1's value (unbiased) with k2's gradient (that of KL(pi || ref)), straight through:
    ``k2 - sg(k2) + sg(k1)``."""
    return _straight_through(k1(log_ratio), k2(log_ratio))


@KL_ESTIMATORS.register("k3+")
def k3_plus(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3's value (unbiased, non-negative, low variance) with k2's gradient (that of
    KL(pi || ref)), straight through: ``k2 - sg(k2) + sg(k3)``."""
    return _straight_through(k3(log_ratio), k2(log_ratio))


def _straight_through(value: torch.Tensor, grad_of: torch.Tensor) -> torch.Tensor:
    """Equal to ``value`` in value, with the gradient of ``grad_of``."""
    return grad_of - grad_of.detach() + value.detach()


KL_CLAMP = 10.0  # algorithm.kl_clamp's default


def kl_estimate(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kind: str,
    clamp: float | None = KL_CLAMP,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating
    KL") with estimator ``kind`` of ``KL_ESTIMATORS``.

    Departures: log r is clamped to [-20, 20] so k3 stays finite, and the estimate to
    [-``clamp``, ``clamp``] (``algorithm.kl_clamp``; None: not), with zero gradient beyond, as
    the widely used reference implementation clamps k3 at 10. Without it one stale or
    mismatched token dominates a batch: k3 is 16.1 at a log-ratio of 3, 2,972 at 8 and 4.85e8
    at 20, with gradient 1 - e^x; at 10 a token's KL term is at most 10 x kl_coef.

    As a reward penalty each is a value. As a loss term what matters is its gradient under
    samples of pi: k2's is the gradient of KL(pi || ref); k3's (GRPO's choice) is that of the
    forward KL(ref || pi); k1's has expectation zero, so the config rejects k1 as a loss.
    ``abs`` (|log r|, an upper bound of the KL in expectation) has a sign-based gradient of
    unit size per token whose expectation is twice that of TV(pi, ref). The straight-through
    ``k1+`` and ``k3+`` have the value of k1 / k3 (what is reported, and penalised as a
    reward) and k2's gradient, so as a loss they give the unbiased gradient of KL(pi || ref)
    while reporting an unbiased value. The clamp acts on the value: a token whose k1 / k3
    value lies beyond it gets no gradient.
    """
    estimator = KL_ESTIMATORS.get(kind)
    kl = estimator((ref_logprobs - logprobs).clamp(-20.0, 20.0))
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def adaptive_kl_coef(
    coef: float, observed_kl: float, target_kl: float, num_samples: int, horizon: int
) -> float:
    """One update of the adaptive KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language
    Models from Human Preferences", sec. 2.2): ``coef * (1 + clip(KL / target - 1, -0.2, 0.2)
    * num_samples / horizon)``. ``observed_kl`` is the mean per-sequence KL of the batch,
    ``num_samples`` its size; the coefficient rises when the policy drifts past the target.
    """
    if not math.isfinite(observed_kl):
        return coef
    error = min(max(observed_kl / target_kl - 1.0, -0.2), 0.2)
    return coef * (1.0 + error * num_samples / horizon)
