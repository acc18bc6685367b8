"""Advantage estimators: pure functions from rewards to per-sample advantages."""

from __future__ import annotations

import numpy as np

from rlsys.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator", "algorithm.advantage")


@ADVANTAGES.register("grpo")
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
