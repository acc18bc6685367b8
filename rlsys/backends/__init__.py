"""Training backends of a learner rank: FSDP2 and DeepSpeed ZeRO, on a shared base.

``BACKENDS`` (``learner.backend`` / ``critic.backend``) maps each name to a builder that
imports its backend module only when called (they import torch and deepspeed), so the config
can validate names cheaply. A builder takes the learner config, ``TrainingBackend``'s
leading arguments (``common`` in ``build_backend``), ``trainable`` and ``lora``; export.py's
``CHECKPOINT_READERS`` reads each backend's checkpoints offline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlsys.registry import Registry

if TYPE_CHECKING:
    import torch

    from rlsys.backends.base import TrainingBackend
    from rlsys.config.learner import LearnerConfig
    from rlsys.config.schema import LoraConfig

Builder = Callable[..., "TrainingBackend"]
BACKENDS: Registry[Builder] = Registry("training backend", "learner.backend")


@BACKENDS.register("fsdp2", float16=True)  # deepspeed: no fp16 loss scaling here
def _fsdp2(cfg: LearnerConfig, *common: Any, **kwargs: Any) -> TrainingBackend:
    from rlsys.backends.fsdp import FSDP2Backend
    from rlsys.backends.memory import MemorySettings

    memory = MemorySettings.of(cfg)
    return FSDP2Backend(
        *common, cfg.mixed_precision, _compile_backend(cfg), memory=memory, **kwargs
    )


@BACKENDS.register("deepspeed")
def _deepspeed(cfg: LearnerConfig, *common: Any, **kwargs: Any) -> TrainingBackend:
    from rlsys.backends.deepspeed import DeepSpeedBackend
    from rlsys.backends.memory import MemorySettings

    memory = MemorySettings.of(cfg)
    return DeepSpeedBackend(
        *common,
        cfg.mixed_precision,
        _compile_backend(cfg),
        memory=memory,
        zero=cfg.deepspeed,
        **kwargs,
    )


def _compile_backend(cfg: LearnerConfig) -> str | None:
    """The torch.compile backend the decoder layers compile with; None: they run eagerly."""
    return cfg.compile_backend if cfg.compile else None


def build_backend(
    cfg: LearnerConfig,
    model_path: str,
    dtype: str,
    temperature: float,
    device: torch.device,
    role: str = "policy",
    trainable: bool = True,
    lora: LoraConfig | None = None,
    freeze_vision: bool = False,
) -> TrainingBackend:
    """This rank's backend as ``cfg.backend`` names it (after ``init_process_group``);
    ``trainable=False``: forward passes only, no optimizer (the reference policy);
    ``lora``: train LoRA adapters only (``model.lora``); ``freeze_vision``: a VL model's
    vision tower neither trains nor travels (``model.freeze_vision``)."""
    common = (model_path, dtype, cfg.optim, cfg.micro_batch_size, temperature, device, role)
    backend = BACKENDS.get(cfg.backend)
    extra = {"freeze_vision": True} if freeze_vision else {}
    return backend(
        cfg,
        *common,
        trainable=trainable,
        lora=lora,
        max_tokens_per_micro_batch=cfg.max_tokens_per_micro_batch,
        logits_chunk_tokens=cfg.logits_chunk_tokens,
        packing=cfg.packing,
        share_prompts=cfg.share_prompts,
        skip_zero_advantage=cfg.skip_zero_advantage,
        **extra,
    )
