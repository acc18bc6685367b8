"""Off-policy correction: per-token importance weights from the engine's behaviour
log-probabilities to the learner's policy before the update.

The learner's PPO ratio is taken against ``old_logprobs`` (the learner's own forward pass
before the update, the *proximal* policy). The tokens were drawn by the *behaviour* policy:
the engine, whose weights may be versions older (asynchronous training) and whose numerics
differ anyway (bf16 kernels, another attention implementation). The weight
``pi_old / pi_behaviour`` corrects the gradient estimate for that difference.

* ``none``: no weight. Right for synchronous training when the mismatch (logged as
  ``train/logprob_mismatch``) is small.
* ``tis``: truncated importance sampling, ``min(w, cap)`` (Ionides 2008). Applied to the
  rollout/training mismatch by Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
  Off-Policy RL Training". Truncation bounds the variance and biases towards the behaviour.
* ``decoupled``: decoupled PPO (Hilton et al. 2022, "Batch size-invariance for policy
  optimization"), as used for asynchronous RL by AReaL (Fu et al. 2025): the clip is around the
  proximal policy and the loss is weighted by ``w``. Departure from the paper, following AReaL:
  tokens with ``w > cap`` are given weight 0 (rejected) rather than truncated; they still count
  in the loss normaliser.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlsys.registry import Registry

LOG_RATIO_CLAMP = 20.0  # exp() of a larger log-ratio overflows float32

# A correction maps the (B, T-1) ratios w = pi_old / pi_behaviour, the mask of tokens over
# the cap and the cap to per-token weights (None: no weighting).
Correction = Callable[[np.ndarray, np.ndarray, float], "np.ndarray | None"]
OFF_POLICY_CORRECTIONS: Registry[Correction] = Registry(
    "off-policy correction", "algorithm.off_policy"
)


@OFF_POLICY_CORRECTIONS.register("none")
def no_correction(ratio: np.ndarray, over: np.ndarray, cap: float) -> np.ndarray | None:
    return None


@OFF_POLICY_CORRECTIONS.register("tis")
def truncated(ratio: np.ndarray, over: np.ndarray, cap: float) -> np.ndarray | None:
    """Truncated importance sampling: ``min(w, cap)``."""
    return np.minimum(ratio, cap)


@OFF_POLICY_CORRECTIONS.register("decoupled")
def decoupled(ratio: np.ndarray, over: np.ndarray, cap: float) -> np.ndarray | None:
    """Decoupled PPO as in AReaL: ``w``, and 0 for tokens over the cap (rejected)."""
    return np.where(over, 0.0, ratio)


def importance_weights(
    old_logprobs: np.ndarray,
    behaviour_logprobs: np.ndarray,
    mask: np.ndarray,
    mode: str,
    cap: float,
) -> tuple[np.ndarray | None, dict[str, float]]:
    """(B, T-1) weights of correction ``mode`` of ``OFF_POLICY_CORRECTIONS`` (None for
    ``none``) and metrics over the masked tokens: ``offpolicy/ratio_mean`` and ``ratio_max``
    of ``w = pi_old / pi_behaviour``,
    ``offpolicy/capped_frac`` (tokens over ``cap``) and ``offpolicy/weight_mean``."""
    correction = OFF_POLICY_CORRECTIONS.get(mode)
    on = mask > 0
    log_ratio = np.clip(old_logprobs - behaviour_logprobs, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = np.where(on, np.exp(log_ratio), 1.0).astype(np.float32)
    over = on & (ratio > cap)
    weights = correction(ratio, over, cap)
    metrics = {}
    if on.any():
        applied = weights if weights is not None else np.ones_like(ratio)
        metrics = {
            "offpolicy/ratio_mean": float(ratio[on].mean()),
            "offpolicy/ratio_max": float(ratio[on].max()),
            "offpolicy/capped_frac": float(over[on].mean()),
            "offpolicy/weight_mean": float(applied[on].mean()),
        }
    if weights is not None:
        weights = np.where(on, weights, 0.0).astype(np.float32)
    return weights, metrics
