"""Per-token losses and KL estimators: pure torch functions, no model or config state.

Every loss returns a (B, T-1) tensor of per-token losses plus detached metrics; the learner
masks and aggregates them (``token_mean``), so a loss never sees padding rules or sharding.
"""

from __future__ import annotations

import torch


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

    With log r = ref - logp:  k1 = -log r;  k2 = (log r)^2 / 2;  k3 = r - 1 - log r (unbiased,
    non-negative, low variance). Departure: log r is clamped to [-20, 20] so k3 stays finite.
    """
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    if kind == "k1":
        return -log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        return log_ratio.exp() - 1.0 - log_ratio
    raise ValueError(f"algorithm.kl_estimator={kind!r}: use k1, k2 or k3")


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate per token (Schulman et al. 2017, eq. 7), negated for descent.

    ``-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)`` with
    ``ratio = exp(logprobs - old_logprobs)``; all inputs (B, T-1). Departure: separate low
    and high clip ranges (equal by default; DAPO's clip-higher when ``clip_high > clip_low``).
    Metrics: the clipped indicator (for the clip fraction) and k3 KL(old || new).
    """
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {
            "clipped": (clipped > unclipped).float(),
            "approx_kl": (-log_ratio).exp() - 1.0 + log_ratio,
        }
    return loss, metrics


def nll_loss(logprobs: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning: negative log-likelihood of each target token."""
    return -logprobs


def token_mean(per_token: torch.Tensor, mask: torch.Tensor, denominator: float) -> torch.Tensor:
    """Sum of masked per-token values divided by ``denominator`` (the global token count).

    Passing the token count of the whole mini-batch across all ranks (rather than this rank's
    count) makes data-parallel gradients equal to the single-process token mean.
    """
    return (per_token * mask).sum() / max(denominator, 1.0)
