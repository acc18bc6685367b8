"""Per-token losses and loss aggregation: pure tensor functions, no model or config state.

Every loss returns a (B, T-1) tensor of per-token losses (to be minimised) plus detached
metrics; the learner weighs them with ``loss_weights`` and sums, so a loss never sees
padding rules or sharding. ``LOSS_AGGREGATIONS`` (``algorithm.loss_agg``) registers the
aggregations under their config names; ``rlsys.algorithms.policy_losses`` registers the policy
losses with their settings.

Torch is not imported here (tensor methods only): a config is resolved against these
registries without paying for torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlsys.registry import Registry

if TYPE_CHECKING:
    import torch

Metrics = dict[str, "torch.Tensor"]


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
    loss = unclipped.maximum(clipped)
    metrics = {}
    if dual_clip is not None:
        negative = advantages < 0
        bounded = loss.minimum(-dual_clip * advantages)
        metrics["dual_clipped"] = (negative & (bounded < loss)).float()  # no gradient
        loss = bounded.where(negative, loss)
    metrics["clipped"] = (clipped > unclipped).float()
    detached = log_ratio.detach()
    metrics["approx_kl"] = (-detached).exp() - 1.0 + detached
    return loss, metrics


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    log_ratio_clamp: float = 10.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al. 2025), GSPO-token form (eq. 13).

    The importance ratio is the sequence's length-normalised likelihood ratio
    ``s = exp(mean_t(logprobs - old_logprobs))`` over its trained tokens, clipped as a whole;
    every token carries ``s_t = sg[s] * pi_t / sg[pi_t]``, equal to ``s`` in value, with
    gradient ``s * grad log pi_t``. Aggregated with ``seq_mean_token_mean`` and one advantage
    per sequence this is exactly GSPO's sequence-level objective. Inputs (B, T-1).

    Departure: the sequence log-ratio is clamped at ``log_ratio_clamp``
    (``algorithm.gspo_log_ratio_clamp``, 10 as in the widely used reference implementation;
    zero gradient beyond), so a stale sample's unclipped side (negative advantage) costs at
    most ``|A| e^10`` per token instead of about 3e6 at the old bound of 20.
    """
    maskf = mask.to(logprobs.dtype)
    lengths = maskf.sum(-1, keepdim=True).clamp(min=1.0)
    seq_log_ratio = ((logprobs - old_logprobs) * maskf).sum(-1, keepdim=True) / lengths
    token_log_ratio = seq_log_ratio.detach() + logprobs - logprobs.detach()
    ratio = token_log_ratio.clamp(max=log_ratio_clamp).exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = unclipped.maximum(clipped)
    seq = seq_log_ratio.detach().expand_as(logprobs)
    metrics = {
        "clipped": (clipped > unclipped).float(),
        "approx_kl": (-seq).exp() - 1.0 + seq,
    }
    return loss, metrics


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention"): clip the importance weight, not the update.

    Per token ``-sg(w) * A * log pi`` with ``w = clip(ratio, 1 - clip_low, 1 + clip_high)``:
    the weight is detached, so a token whose ratio left the range still has a gradient (a
    bounded one), unlike PPO's clip which zeroes it. Inputs (B, T-1).

    Departures: none in the gradient. The value is written ``-sg(w) * A * (1 + log pi -
    sg(log pi))``: the same gradient, with PPO's surrogate value ``-w * A`` rather than
    ``-w * A * log pi``, so ``train/loss`` stays comparable across presets. The log-ratio is
    clamped to [-20, 20] (only the detached weight uses it). The report disables the lower
    bound by a large ``clip_low`` (>= 1 here: the weight is never clipped below). Metrics: the
    clipped-weight indicator and k3 KL(old || new).
    """
    log_ratio = (logprobs - old_logprobs).detach().clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -advantages * weight * (1.0 + logprobs - logprobs.detach())
    metrics = {
        "clipped": (weight != ratio).float(),
        "approx_kl": (-log_ratio).exp() - 1.0 + log_ratio,
    }
    return loss, metrics


def gmpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    log_ratio_clamp: float = 10.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Geometric-Mean Policy Optimization (Zhao et al. 2025, "Geometric-Mean Policy
    Optimization"): the sequence's ratio is the geometric mean of its clipped token ratios.

    Per token, in log space, with ``s = sign(A)`` and ``l_t = log pi_t - log pi_old_t``:
    ``c_t = s * min(s * l_t, s * clip(l_t, -clip_low, clip_high))`` (the pessimistic side, as
    PPO's min); ``R = exp(mean_t c_t)`` over the sequence's trained tokens; objective ``R * A``.
    Every token carries ``-A * exp(sg[m] + c_t - sg[c_t])`` with ``m = mean_t c_t``: value
    ``-A * R``, gradient ``-A * R * grad c_t``. Aggregated with ``seq_mean_token_mean`` and one
    advantage per sequence this is exactly GMPO's sequence objective and its gradient; with
    per-token advantages each token uses its own sign and value. Inputs (B, T-1).

    ``clip_low`` / ``clip_high`` (``algorithm.clip_eps`` / ``clip_eps_high``) are log-space
    bounds here: the paper's range (e^-0.4, e^0.4) is 0.4 / 0.4. Departure: ``m`` is clamped
    at ``log_ratio_clamp`` (``algorithm.gspo_log_ratio_clamp``; zero gradient beyond), which
    only a negative advantage can reach (its ``c_t`` is unbounded above), so ``R`` stays
    finite; token log-ratios are clamped to [-20, 20] first. Metrics: the clipped indicator
    (``c_t != l_t``) and k3 KL(old || new) per token.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    sign = advantages.sign()
    bounded = log_ratio.clamp(-clip_low, clip_high)
    clipped = sign * (sign * log_ratio).minimum(sign * bounded)
    trained = mask > 0
    lengths = trained.sum(-1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    seq_mean = clipped.where(trained, 0.0).sum(-1, keepdim=True) / lengths
    token_log_ratio = seq_mean.detach() + clipped - clipped.detach()
    loss = -advantages * token_log_ratio.clamp(max=log_ratio_clamp).exp()
    detached = log_ratio.detach()
    metrics = {
        "clipped": ((clipped.detach() != detached) & (advantages != 0)).float(),
        "approx_kl": (-detached).exp() - 1.0 + detached,
    }
    return loss, metrics


def sapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    tau_pos: float,
    tau_neg: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen team, "Soft Adaptive Policy
    Optimization"): a smooth gate on the ratio instead of PPO's hard clip.

    Per token ``-f(ratio) * A`` with ``f(r) = sigmoid(tau * (r - 1)) * 4 / tau``, ``tau`` being
    ``tau_pos`` where ``A > 0`` and ``tau_neg`` otherwise. The gradient is ``A * w(r) * r *
    grad log pi`` with ``w(r) = 4 sigmoid(x)(1 - sigmoid(x))``, ``x = tau (r - 1)``: exactly the
    policy gradient at ``r = 1`` (``w = 1``), fading smoothly (faster for the larger
    ``tau_neg``) as the ratio leaves 1, never cut to zero at a fixed range. Inputs (B, T-1).

    Departure: the log-ratio is clamped to [-20, 20] (the gate saturates long before; this
    only keeps ``exp`` finite on stale tokens). Metric: k3 KL(old || new).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = log_ratio.exp()
    positive = (advantages > 0).to(logprobs.dtype)
    tau = tau_neg + (tau_pos - tau_neg) * positive
    gate = (tau * (ratio - 1.0)).sigmoid() * 4.0 / tau
    detached = log_ratio.detach()
    return -advantages * gate, {"approx_kl": (-detached).exp() - 1.0 + detached}


def token_covariance(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Per-token ``(log pi - mean log pi) * (A - mean A)``, means over the trained tokens of
    ``mask``; detached, 0 off the mask (Cui et al. 2025's per-token covariance term)."""
    trained = mask > 0
    count = trained.sum().clamp(min=1).to(logprobs.dtype)
    logp = logprobs.detach().where(trained, 0.0)
    adv = advantages.detach().where(trained, 0.0)
    cov = (logp - logp.sum() / count) * (adv - adv.sum() / count)
    return cov.where(trained, 0.0)


def _selection_size(ratio: float, trained: torch.Tensor) -> int:
    """How many of the trained tokens a covariance method picks: ``floor(ratio * n)``, at
    least one while any token is trained (the paper's ratios round to zero in small batches)."""
    n = int(trained.sum())
    return 0 if n == 0 else max(1, int(ratio * n + 1e-9))


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of the ``k`` largest entries of ``scores`` (ties broken arbitrarily)."""
    flat = scores.flatten()
    chosen = flat.new_zeros(flat.shape)
    if k > 0:
        chosen.index_fill_(0, flat.topk(min(k, flat.numel())).indices, 1.0)
    return chosen.view(scores.shape) > 0


def clip_cov_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    cov_ratio: float,
    cov_low: float,
    cov_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models"): PPO's clipped loss, with the gradient of a few random
    high-covariance tokens detached, so they stop driving the entropy down.

    ``cov_t = (log pi_t - mean log pi) * (A_t - mean A)`` (``token_covariance``); among the
    trained tokens with ``cov_low <= cov_t <= cov_high`` it picks ``max(1, floor(cov_ratio *
    n))`` (n trained tokens) uniformly at random and keeps their loss value but detaches its
    gradient. Inputs (B, T-1); clip ranges and ``dual_clip`` as ``ppo_clip_loss``.

    Departures: the means and n are over the micro-batch's trained tokens on this rank (the
    paper: the batch); at least one token is picked (the paper's 2e-4 rounds to none in a
    small micro-batch); tokens that PPO already clipped (no gradient) are not candidates; the
    draw uses torch's default generator on the tensor's device (no generator of its own; the
    learner does not seed it from ``run.seed``). Metrics: ``ppo_clip_loss``'s plus
    ``cov_selected`` (the detached tokens).
    """
    loss, metrics = ppo_clip_loss(
        logprobs, old_logprobs, advantages, clip_low, clip_high, dual_clip
    )
    cov = token_covariance(logprobs, advantages, mask)
    trained = mask > 0
    frozen = metrics["clipped"] + metrics.get("dual_clipped", 0.0) > 0  # no gradient already
    candidates = trained & ~frozen & (cov >= cov_low) & (cov <= cov_high)
    draw = cov.new_empty(cov.shape).uniform_().where(candidates, -1.0)
    selected = _top(draw, _selection_size(cov_ratio, trained)) & candidates
    metrics["cov_selected"] = selected.to(logprobs.dtype)
    return loss.where(~selected, loss.detach()), metrics


def kl_cov_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cov_ratio: float,
    coef: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
    Language Models"): the unclipped surrogate, plus a KL penalty on the tokens of
    highest covariance between log-probability and advantage.

    Per token ``-ratio * A``, plus ``coef * |log pi - log pi_old|`` on the
    ``max(1, floor(cov_ratio * n))`` trained tokens of largest ``cov_t`` (``token_covariance``;
    n trained tokens). The penalty is 0 with zero gradient at ratio 1, so it acts from the
    second optimizer step on a batch (``learner.ppo_epochs`` or ``num_mini_batches`` > 1).
    Inputs (B, T-1).

    Departures: covariance means, n and the top-k are over the micro-batch's trained tokens on
    this rank (the paper: the batch); at least one token is picked; the log-ratio is clamped
    to [-20, 20]. Metrics: ``cov_selected`` (the penalised tokens) and k3 KL(old || new).
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    trained = mask > 0
    cov = token_covariance(logprobs, advantages, mask).where(trained, float("-inf"))
    selected = _top(cov, _selection_size(cov_ratio, trained)) & trained
    penalty = coef * log_ratio.abs() * selected.to(logprobs.dtype)
    detached = log_ratio.detach()
    metrics = {
        "cov_selected": selected.to(logprobs.dtype),
        "approx_kl": (-detached).exp() - 1.0 + detached,
    }
    return -advantages * log_ratio.exp() + penalty, metrics


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
        clipped_frac = error.new_zeros(error.shape)
    else:
        clipped_values = old_values + (values - old_values).clamp(-clip, clip)
        clipped_error = (clipped_values - returns).square()
        loss = 0.5 * error.maximum(clipped_error)
        clipped_frac = (clipped_error > error).float().detach()
    return loss, {"value_clipped": clipped_frac, "value_error": error.detach()}


def nll_loss(logprobs: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning: negative log-likelihood of each target token."""
    return -logprobs


# An aggregation maps the float (B, T-1) mask, the mini-batch's trained tokens and sequences
# over all ranks, and algorithm.loss_agg_norm to per-token weights (see ``loss_weights``).
Aggregation = Callable[["torch.Tensor", float, float, "float | None"], "torch.Tensor"]
LOSS_AGGREGATIONS: Registry[Aggregation] = Registry("loss aggregation", "algorithm.loss_agg")


@LOSS_AGGREGATIONS.register("token_mean")
def token_mean(
    mask: torch.Tensor, num_tokens: float, num_seqs: float, norm: float | None
) -> torch.Tensor:
    """Every token of the mini-batch equal (DAPO's token-level loss)."""
    return mask / max(num_tokens, 1.0)


@LOSS_AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(
    mask: torch.Tensor, num_tokens: float, num_seqs: float, norm: float | None
) -> torch.Tensor:
    """Sum over a sequence's tokens, mean over sequences."""
    return mask / max(num_seqs, 1.0)


@LOSS_AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    mask: torch.Tensor, num_tokens: float, num_seqs: float, norm: float | None
) -> torch.Tensor:
    """Mean over a sequence's tokens, then over sequences (GRPO's 1/|o|, and GSPO's)."""
    lengths = mask.sum(-1, keepdim=True).clamp(min=1.0)
    return mask / lengths / max(num_seqs, 1.0)


@LOSS_AGGREGATIONS.register("seq_sum_norm")
def seq_sum_norm(
    mask: torch.Tensor, num_tokens: float, num_seqs: float, norm: float | None
) -> torch.Tensor:
    """Sum over tokens divided by the constant ``norm``, mean over sequences (Dr.GRPO)."""
    if not norm or norm <= 0:
        raise ValueError(
            f"algorithm.loss_agg=seq_sum_norm needs a positive algorithm.loss_agg_norm, got {norm}"
        )
    return mask / (norm * max(num_seqs, 1.0))


@LOSS_AGGREGATIONS.register("token_sum")
def token_sum(
    mask: torch.Tensor, num_tokens: float, num_seqs: float, norm: float | None
) -> torch.Tensor:
    """The sum over every trained token of the mini-batch, no normaliser. Exact across ranks
    and micro-batches like the others (each rank's loss is scaled by the world size against
    the backends' gradient averaging).

    The gradient is token_mean's times the mini-batch's token count (thousands), so with
    plain SGD the learning rate would have to shrink by that factor. AdamW's update is
    nearly blind to a constant scale, but ``learner.optim.grad_clip`` (a global-norm bound,
    1.0) then clips almost every step, turning each step's gradient into a unit-norm
    direction: raise the bound (or 0: off) to keep the sum's weighting across steps."""
    return mask


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
    loss as one process. Modes (``mask`` (B, T-1); ``LOSS_AGGREGATIONS``):

    - ``token_mean``: every token of the mini-batch equal (DAPO's token-level loss);
    - ``seq_mean_token_sum``: sum over a sequence's tokens, mean over sequences;
    - ``seq_mean_token_mean``: mean over a sequence's tokens, then over sequences (GRPO's
      original 1/|o| normaliser, and GSPO's);
    - ``seq_sum_norm``: sum over tokens divided by the constant ``norm`` (e.g. the generation
      budget), mean over sequences: Dr.GRPO's length-unbiased form;
    - ``token_sum``: the plain sum over every trained token (weights = mask): the gradient
      scales with the mini-batch's token count, so the learning rate must shrink to match.
    """
    return LOSS_AGGREGATIONS.get(mode)(mask.float(), num_tokens, num_seqs, norm)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", norm: float | None = None
) -> torch.Tensor:
    """The scalar loss of one whole (unsharded) batch under aggregation ``mode``."""
    num_tokens = float(mask.sum())
    num_seqs = float((mask.sum(-1) > 0).sum())
    return (per_token * loss_weights(mask, mode, num_tokens, num_seqs, norm)).sum()
