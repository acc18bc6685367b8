"""Reward shaping and sample filters applied before advantages (pure numpy)."""

from __future__ import annotations

import numpy as np


def overlong_penalty(
    lengths: np.ndarray, max_len: int, buffer_len: int, factor: float = 1.0
) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the reward.

    0 for ``|y| <= max_len - buffer_len``; ``factor * ((max_len - buffer_len) - |y|) /
    buffer_len`` inside the buffer (falling linearly to ``-factor`` at ``max_len``); and
    ``-factor`` beyond. ``buffer_len=0`` switches it off. lengths: (B,) response tokens.
    Departure: ``factor`` scales the penalty (1 in the paper).
    """
    lengths = np.asarray(lengths, dtype=np.float64)
    if buffer_len <= 0:
        return np.zeros(lengths.shape, np.float32)
    start = max_len - buffer_len
    penalty = np.clip((start - lengths) / buffer_len, -1.0, 0.0)
    return (factor * penalty).astype(np.float32)


def overlong_buffer_len(max_new_tokens: int, fraction: float) -> int:
    """DAPO's L_cache as a fraction of the generation budget, rounded down (the paper's
    4096 of 20480 tokens is 0.2); a budget too short for one buffer token gives 0 (off)."""
    return int(fraction * max_new_tokens)
