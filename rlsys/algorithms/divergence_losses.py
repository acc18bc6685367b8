"""Policy losses whose trust region is a divergence from the pre-update policy rather than a
clipped ratio: DPPO's binary TV and binary KL masks, and DRO's quadratic log-ratio penalty.
Pure tensor functions, no model or config state, in the form of ``rlsys.algorithms.losses``:
each returns a (B, T-1) tensor of per-token losses plus detached metrics.

Torch is not imported here (tensor methods only), as in ``losses``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# verl's guard on 1 - p in the binary KL (a token of probability 1 stays finite)
_BINARY_EPS = 1e-8


def _dppo_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    ratio_cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO's per-token loss given its trust-region mask: ``-sg(min(ratio, cap)) * A`` in value,
    ``-sg(min(ratio, cap)) * A * grad log pi`` in gradient, on the ``valid`` tokens only."""
    log_ratio = (logprobs - old_logprobs).detach().clamp(-20.0, 20.0)  # weights only
    weight = log_ratio.exp().clamp(max=ratio_cap)
    keep = valid.to(logprobs.dtype)  # a mask of detached values
    loss = -advantages * weight * keep * (1.0 + logprobs - logprobs.detach())
    metrics = {
        "clipped": 1.0 - keep,
        "approx_kl": (-log_ratio).exp() - 1.0 + log_ratio,
    }
    return loss, metrics


def dppo_tv_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    delta_low: float,
    delta_high: float,
    ratio_cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
    Learning", arXiv 2602.04879): PPO's ratio clip replaced by a mask on the total variation
    between the old and new policy, approximated on the binary split {sampled token, rest}.

    With ``p = pi(a)`` and ``q = pi_old(a)`` the binary TV is ``|p - q|``. A token keeps its
    gradient unless the update has already pushed it past the trust region in its advantage's
    direction: ``p - q <= delta_high`` where ``A > 0``, ``p - q >= -delta_low`` otherwise.
    Kept tokens carry the importance-weighted policy gradient ``-sg(w) * A * grad log pi``,
    ``w = min(ratio, ratio_cap)`` (the paper's truncated importance sampling in place of the
    dual clip); masked tokens carry nothing. Unlike the ratio, ``p - q`` is small for rare
    tokens, so they are not clipped for moving a lot relative to their tiny probability.
    Inputs (B, T-1).

    Departures: the divergence is from ``old_logprobs`` (the learner's pre-update policy, as
    in verl's ``dppo_tv``), not from the sampling policy (engine-learner mismatch is
    ``algorithm.off_policy``'s to correct); the value is written ``-w * A`` on kept tokens
    (verl: ``-w * A * log pi``), the same gradient, so ``train/loss`` compares with PPO's
    surrogate; the log-ratio is clamped to [-20, 20]. Metrics: the masked indicator (as
    ``clipped``) and k3 KL(old || new).
    """
    shift = logprobs.detach().exp() - old_logprobs.exp()
    valid = (shift <= delta_high).where(advantages > 0, shift >= -delta_low)
    return _dppo_surrogate(logprobs, old_logprobs, advantages, valid, ratio_cap)


def dppo_kl_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    delta_low: float,
    delta_high: float,
    ratio_cap: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPPO-Binary-KL (Qi et al. 2026, as ``dppo_tv_loss``): the trust region is the KL
    divergence between the old and new policy on the binary split {sampled token, rest}.

    ``KL = q log(q / p) + (1 - q) log((1 - q) / (1 - p))`` with ``p = pi(a)``, ``q =
    pi_old(a)``. A token is masked only when that KL exceeds its bound and the update moved it
    in its advantage's direction: ``A > 0`` masks ``p > q`` with ``KL > delta_high``, ``A <=
    0`` masks ``p < q`` with ``KL > delta_low``. Kept tokens carry ``-sg(w) * A * grad log pi``,
    ``w = min(ratio, ratio_cap)``. Inputs (B, T-1).

    Departures: as ``dppo_tv_loss`` (divergence from ``old_logprobs``, value ``-w * A``,
    log-ratio clamp); ``1 - p`` and ``1 - q`` get verl's 1e-8 inside the logarithm so a token
    of probability 1 stays finite. Metrics: the masked indicator (as ``clipped``) and k3
    KL(old || new).
    """
    log_p, log_q = logprobs.detach(), old_logprobs.detach()
    p, q = log_p.exp(), log_q.exp()
    rest = ((1.0 - q + _BINARY_EPS) / (1.0 - p + _BINARY_EPS)).log()
    binary_kl = q * (log_q - log_p) + (1.0 - q) * rest
    up = (binary_kl <= delta_high) | (p <= q)
    down = (binary_kl <= delta_low) | (p >= q)
    valid = up.where(advantages > 0, down)
    return _dppo_surrogate(logprobs, old_logprobs, advantages, valid, ratio_cap)


def dro_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Direct Reward Optimisation (Richemond et al. 2024, "Offline Regularised Reinforcement
    Learning for Large Language Models Alignment", arXiv 2405.19107), in the per-token form
    of verl's ``dro`` loss.

    Per token ``-(A * log pi - beta / 2 * (log pi - log pi_old)^2)``: the policy gradient
    plus a quadratic pull towards the pre-update policy, gradient ``(-A + beta * l) * grad log
    pi`` with ``l = log pi - log pi_old``. It is 0 at the first optimizer step on a batch
    (plain policy gradient there) and bounds how far later steps drift; no importance ratio.
    The paper's DRO-V regresses ``r - V(x)`` onto ``beta * log(pi / pi_ref)`` per sequence;
    the policy gradient of that squared error, divided by beta, is this loss's with ``A = r -
    V(x)`` and ``pi_ref`` in place of ``pi_old``.
    Inputs (B, T-1).

    Departures (as verl): per token, not per sequence; the anchor is the pre-update policy
    (``old_logprobs``), not a fixed reference; ``A`` comes from ``algorithm.advantage`` rather
    than the paper's jointly learned value; the value includes ``-A * log pi`` (verl's), so
    ``train/loss`` is not on PPO's surrogate scale. Metric: k3 KL(old || new).
    """
    log_ratio = logprobs - old_logprobs
    loss = -(advantages * logprobs - 0.5 * beta * log_ratio.square())
    detached = log_ratio.detach().clamp(-20.0, 20.0)
    return loss, {"approx_kl": (-detached).exp() - 1.0 + detached}
