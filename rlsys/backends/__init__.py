"""Training backends of a learner rank: FSDP2 and DeepSpeed ZeRO, on a shared base."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from rlsys.backends.base import TrainingBackend
    from rlsys.config.learner import LearnerConfig


def build_backend(
    cfg: LearnerConfig,
    model_path: str,
    dtype: str,
    temperature: float,
    device: torch.device,
    role: str = "policy",
    trainable: bool = True,
) -> TrainingBackend:
    """This rank's backend as ``cfg.backend`` names it (after ``init_process_group``);
    ``trainable=False``: forward passes only, no optimizer (the reference policy)."""
    common = (model_path, dtype, cfg.optim, cfg.micro_batch_size, temperature, device, role)
    if cfg.backend == "deepspeed":
        from rlsys.backends.deepspeed import DeepSpeedBackend

        return DeepSpeedBackend(
            *common, cfg.mixed_precision, cfg.compile, trainable, zero=cfg.deepspeed
        )
    from rlsys.backends.fsdp import FSDP2Backend

    return FSDP2Backend(*common, cfg.mixed_precision, cfg.compile, trainable)
