"""Learning-rate schedule: linear warm-up, then constant or cosine decay to a floor."""

from __future__ import annotations

import math


def lr_at(
    step: int,
    peak: float,
    warmup_steps: int,
    schedule: str,
    min_lr_ratio: float,
    decay_steps: int | None,
) -> float:
    """The learning rate of optimizer step ``step`` (0-based) of a schedule.

    Warm-up rises linearly to ``peak`` over ``warmup_steps``; then "constant" stays there and
    "cosine" falls to ``min_lr_ratio * peak`` at ``decay_steps`` (and stays). Without
    ``decay_steps`` (an open-ended run such as early-stopped SFT) cosine behaves as constant.
    """
    if warmup_steps and step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant" or not decay_steps:
        return peak
    progress = min(1.0, (step - warmup_steps) / max(1, decay_steps - warmup_steps))
    return peak * (min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
