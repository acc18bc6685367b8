"""Per-token losses and loss aggregation: pure torch functions, no model or config state.

Every loss returns a (B, T-1) tensor of per-token losses (to be minimised) plus detached
metrics; the learner weighs them with ``loss_weights`` and sums, so a loss never sees
padding rules or sharding.
"""

from __future__ import annotations

import torch

from rlsys.algorithms.names import LOSS_AGGREGATIONS


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate per token (Schulman et al. 2017, eq. 7), negated for descent.

    ``-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)`` with
    ``ratio = exp(logprobs - old_logprobs)``; all inputs (B, T-1).

    Departures: separate low and high clip ranges (equal in the paper; DAPO's clip-higher
    when ``clip_high > clip_low``); ``dual_clip = c > 1`` also bounds the loss of a negative
    advantage by ``-c * A`` (Ye et al. 2020, "Mastering Complex Control in MOBA Games"), so a
    token whose ratio exploded cannot dominate the update; the log-ratio is clamped to
    [-20, 20] so the ratio stays finite (a padded position never yields inf * 0). Metrics:
    the clipped indicator (for the clip fraction) and k3 KL(old || new).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics = {}
    if dual_clip is not None:
        bounded = torch.minimum(loss, -dual_clip * advantages)
        with torch.no_grad():
            metrics["dual_clipped"] = ((advantages < 0) & (bounded < loss)).float()
        loss = torch.where(advantages < 0, bounded, loss)
    with torch.no_grad():
        metrics["clipped"] = (clipped > unclipped).float()
        metrics["approx_kl"] = (-log_ratio).exp() - 1.0 + log_ratio
    return loss, metrics


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025), GSPO-token form (eq. 13).

    The importance ratio is the sequence's length-normalised likelihood ratio
    ``s = exp(mean_t(logprobs - old_logprobs))`` over its trained tokens, clipped as a whole;
    every token carries ``s_t = sg[s] * pi_t / sg[pi_t]``, equal to ``s`` in value, with
    gradient ``s * grad log pi_t``. Aggregated with ``seq_mean_token_mean`` and one advantage
    per sequence this is exactly GSPO's sequence-level objective. Inputs (B, T-1).
    """
    maskf = mask.to(logprobs.dtype)
    lengths = maskf.sum(-1, keepdim=True).clamp(min=1.0)
    seq_log_ratio = ((logprobs - old_logprobs) * maskf).sum(-1, keepdim=True) / lengths
    token_log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()
    ratio = token_log_ratio.clamp(max=20.0).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        seq = seq_log_ratio.expand_as(logprobs)
        metrics = {
            "clipped": (clipped > unclipped).float(),
            "approx_kl": (-seq).exp() - 1.0 + seq,
        }
    return loss, metrics


def policy_gradient_loss(
    logprobs: torch.Tensor, advantages: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Vanilla policy gradient (Williams 1992, REINFORCE): ``-A * log pi`` per token.

    No importance ratio: exact only on-policy (one epoch, one mini-batch); its gradient
    equals PPO's at ratio 1."""
    return -advantages * logprobs, {}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip: float | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss of PPO's reference implementation (openai/baselines ppo2):
    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)``; ``clip=None`` is the
    plain squared error. Inputs (B, T-1). Metrics: the clipped indicator, the error."""
    error = (values - returns).square()
    if clip is None:
        loss = 0.5 * error
        clipped_frac = torch.zeros_like(error)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped_error = (clipped_values - returns).square()
        loss = 0.5 * torch.maximum(error, clipped_error)
        clipped_frac = (clipped_error > error).float().detach()
    return loss, {"value_clipped": clipped_frac, "value_error": error.detach()}


def nll_loss(logprobs: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning: negative log-likelihood of each target token."""
    return -logprobs


def loss_weights(
    mask: torch.Tensor,
    mode: str,
    num_tokens: float,
    num_seqs: float,
    norm: float | None = None,
) -> torch.Tensor:
    """Per-token weights whose weighted sum of per-token losses is the aggregated loss.

    ``num_tokens`` and ``num_seqs`` count trained tokens and sequences (with any trained
    token) of the whole mini-batch over all ranks, so data-parallel shards sum to the same
    loss as one process. Modes (``mask`` (B, T-1)):

    - ``token_mean``: every token of the mini-batch equal (DAPO's token-level loss);
    - ``seq_mean_token_sum``: sum over a sequence's tokens, mean over sequences;
    - ``seq_mean_token_mean``: mean over a sequence's tokens, then over sequences (GRPO's
      original 1/|o| normaliser, and GSPO's);
    - ``seq_sum_norm``: sum over tokens divided by the constant ``norm`` (e.g. the generation
      budget), mean over sequences: Dr.GRPO's length-unbiased form.
    """
    maskf = mask.float()
    if mode == "token_mean":
        return maskf / max(num_tokens, 1.0)
    if mode == "seq_mean_token_sum":
        return maskf / max(num_seqs, 1.0)
    if mode == "seq_mean_token_mean":
        lengths = maskf.sum(-1, keepdim=True).clamp(min=1.0)
        return maskf / lengths / max(num_seqs, 1.0)
    if mode == "seq_sum_norm":
        if not norm or norm <= 0:
            raise ValueError(
                f"algorithm.loss_agg=seq_sum_norm needs a positive algorithm.loss_agg_norm, "
                f"got {norm}"
            )
        return maskf / (norm * max(num_seqs, 1.0))
    raise ValueError(f"algorithm.loss_agg={mode!r} is not one of {list(LOSS_AGGREGATIONS)}")


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", norm: float | None = None
) -> torch.Tensor:
    """The scalar loss of one whole (unsharded) batch under aggregation ``mode``."""
    num_tokens = float(mask.sum())
    num_seqs = float((mask.sum(-1) > 0).sum())
    return (per_token * loss_weights(mask, mode, num_tokens, num_seqs, norm)).sum()
