"""Advantage estimators: pure numpy functions from rewards (and values) to advantages.

Conventions: ``(G, n)`` arrays hold one row per prompt group of ``n`` samples; ``(B, T-1)``
per-token arrays follow ``rlsys.types`` (entry t scores token t+1) with ``mask`` 1 on trained
response tokens. Positions with mask 0 inside a response (environment or tool tokens) are
skipped by the token-level recursions: the next action token's value and advantage carry
across them, and they get advantage 0. Outputs are float32.
"""

from __future__ import annotations

import numpy as np


def grpo_advantages(
    rewards: np.ndarray, normalize_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """Group-relative advantages of GRPO (Shao et al. 2024, DeepSeekMath, eq. 3).

    rewards: (G, n) outcome rewards, one row per prompt group. Returns (G, n):
    ``(r - mean_group(r)) / (std_group(r) + eps)``, the same value for every token of a
    response (outcome supervision).

    Departures: ``normalize_std=False`` drops the std division (the Dr.GRPO fix for the
    difficulty bias); std is the unbiased sample std, as in the paper's reference code; a
    group of one sample gets advantage 0.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    if not normalize_std:
        return centred.astype(np.float32)
    n = rewards.shape[1]
    std = rewards.std(axis=1, ddof=1, keepdims=True) if n > 1 else np.ones_like(centred[:, :1])
    return (centred / (std + eps)).astype(np.float32)


def dr_grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """Dr.GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.2).

    ``r - mean_group(r)``: GRPO without the std division, which up-weights groups that are
    almost all right or all wrong. The paper's other fix (no 1/|o| length normaliser) is the
    loss aggregation ``seq_sum_norm`` (see ``losses.loss_weights``). rewards: (G, n).
    """
    return grpo_advantages(rewards, normalize_std=False)


def rloo_advantages(rewards: np.ndarray) -> np.ndarray:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    Each sample's baseline is the mean reward of the other n-1 samples of its group:
    ``r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean(r))``. rewards: (G, n), n >= 2.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    if n < 2:
        raise ValueError(
            f"RLOO needs at least 2 samples per group, got {n}: raise rollout.n_samples"
        )
    others = (rewards.sum(axis=1, keepdims=True) - rewards) / (n - 1)
    return (rewards - others).astype(np.float32)


def remax_advantages(rewards: np.ndarray, greedy_rewards: np.ndarray) -> np.ndarray:
    """ReMax (Li et al. 2024): the reward minus the reward of the greedy response to the same
    prompt, a baseline that costs one extra (greedy) generation per prompt and no critic.
    Both (B,) or broadcastable."""
    return (np.asarray(rewards, np.float64) - np.asarray(greedy_rewards, np.float64)).astype(
        np.float32
    )


def last_token_rewards(rewards: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, T-1) token rewards: each sequence's outcome reward on its last trained token."""
    mask = np.asarray(mask)
    out = np.zeros(mask.shape, dtype=np.float64)
    has_tokens = mask.any(axis=1)
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1] > 0, axis=1)
    rows = np.nonzero(has_tokens)[0]
    out[rows, last[rows]] = np.asarray(rewards, np.float64)[rows]
    return out


def discounted_returns(token_rewards: np.ndarray, mask: np.ndarray, gamma: float) -> np.ndarray:
    """Reward-to-go ``G_t = r_t + gamma * G_{t'}`` over trained tokens, t' the next trained
    token (masked positions are skipped and get 0). Shapes (B, T-1)."""
    rewards = np.asarray(token_rewards, np.float64)
    mask = np.asarray(mask) > 0
    out = np.zeros(rewards.shape, dtype=np.float64)
    running = np.zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = np.where(mask[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = np.where(mask[:, t], running, 0.0)
    return out.astype(np.float32)


def whiten(values: np.ndarray, mask: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """``(x - mean) / (std + eps)`` over the masked entries of the whole batch; masked-out
    entries become 0. The std is the population std (ddof 0)."""
    values = np.asarray(values, np.float64)
    keep = np.asarray(mask) > 0
    if not keep.any():
        return np.zeros(values.shape, np.float32)
    selected = values[keep]
    out = (values - selected.mean()) / (selected.std() + eps)
    return np.where(keep, out, 0.0).astype(np.float32)


def reinforce_pp_advantages(
    token_rewards: np.ndarray, mask: np.ndarray, gamma: float = 1.0
) -> np.ndarray:
    """REINFORCE++ (Hu 2025, "REINFORCE++: a simple and efficient approach"): discounted
    returns of the token rewards (outcome reward on the last token, minus the per-token KL
    penalty when the KL is a reward), whitened over every trained token of the batch.

    For REINFORCE++ with baseline the caller first subtracts each group's mean reward from
    the outcome rewards (see ``estimators``); the batch whitening is the same.
    """
    return whiten(discounted_returns(token_rewards, mask, gamma), mask)


def gae_advantages(
    token_rewards: np.ndarray,
    values: np.ndarray,
    mask: np.ndarray,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) with a critic.

    ``delta_t = r_t + gamma * V_{t'} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t'}``,
    t' the next trained token; the value after the last token is 0 (the episode ends).
    Returns ``(advantages, returns = advantages + values)``, both (B, T-1) and 0 where
    ``mask`` is 0. ``values[:, t]`` is the critic's value of the prefix that predicts token
    t+1, aligned like log-probabilities.
    """
    rewards = np.asarray(token_rewards, np.float64)
    values = np.asarray(values, np.float64)
    mask = np.asarray(mask) > 0
    advantages = np.zeros(rewards.shape, dtype=np.float64)
    next_value = np.zeros(rewards.shape[0])
    next_adv = np.zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        live = mask[:, t]
        advantages[:, t] = np.where(live, adv, 0.0)
        next_value = np.where(live, values[:, t], next_value)
        next_adv = np.where(live, adv, next_adv)
    returns = np.where(mask, advantages + values, 0.0)
    return advantages.astype(np.float32), returns.astype(np.float32)
