"""KL to the reference policy: per-token estimators and the adaptive coefficient."""

from __future__ import annotations

import math

import torch


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

    With log r = ref - logp:  k1 = -log r;  k2 = (log r)^2 / 2;  k3 = r - 1 - log r (unbiased,
    non-negative, low variance). Departure: log r is clamped to [-20, 20] so k3 stays finite.

    As a reward penalty each is a value. As a loss term what matters is its gradient under
    samples of pi: k2's is the gradient of KL(pi || ref); k3's (GRPO's choice) is that of the
    forward KL(ref || pi); k1's has expectation zero, so the config rejects k1 as a loss.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        return log_ratio.exp() - 1.0 - log_ratio
    raise ValueError(f"algorithm.kl_estimator={kind!r}: use k1, k2 or k3")


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
