"""What a learner backend trades for memory, as the backend builders pass it."""

from __future__ import annotations

import dataclasses

from rlsys.config.learner import LearnerConfig


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """What a learner trades for memory: the ``learner.`` keys of the same names."""

    activation_checkpointing: bool = False  # recompute decoder layers in backward
    offload: bool = False  # parameters, gradients and optimizer state in host memory
    reduce_dtype: str = "float32"  # gradient reduction dtype under sharded mixed precision

    @classmethod
    def of(cls, cfg: LearnerConfig) -> MemorySettings:
        return cls(cfg.activation_checkpointing, cfg.offload, cfg.reduce_dtype)
