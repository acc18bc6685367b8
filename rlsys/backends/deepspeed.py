"""DeepSpeed training backend: ZeRO-2 or ZeRO-3, optional CPU offload (``learner.offload``).

The batch loop, loss weighting, schedule and forward passes live in ``TrainingBackend``;
this module builds the engine on the process group the learner already started and owns
backward, the clipped step, gathering and the sharded checkpoint (``engine.save_checkpoint``,
which loads only into the same world size).

DeepSpeed averages gradients over the data-parallel ranks (like FSDP), so the base class's
``loss * world_size`` keeps the global-sum loss exact. Its own checks skip a step whose grad
norm is not finite (fp32 always, bf16 with ``check_grad_overflow``); we read the outcome back.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlsys.backends.base import TrainingBackend
from rlsys.backends.checkpoint import BackendCheckpointError, check_deepspeed_files
from rlsys.config.learner import DeepSpeedConfig

DS_DIR = "deepspeed"  # the checkpoint's engine state: DS_DIR/DS_TAG/*.pt
DS_TAG = "state"


def _import_deepspeed(device: torch.device):
    """deepspeed, set up for this process: its accelerator named (no probing), LOCAL_RANK set
    (its sanity check wants one; a Ray actor sees its one GPU as device 0), quiet logs, and
    its communication layer on the process group the learner already initialised."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device.type == "cuda" else "cpu")
    local = torch.cuda.current_device() if device.type == "cuda" else 0
    os.environ.setdefault("LOCAL_RANK", str(local))
    try:
        import deepspeed
    except ImportError as exc:
        raise ImportError(
            "learner.backend=deepspeed needs the deepspeed package: install the cpu or gpu "
            "extras (DS_BUILD_OPS=0 pip install deepspeed), or set backend=fsdp2"
        ) from exc
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    if device.type == "cpu":
        # DeepSpeed's CPU communication layer JIT-builds its shared-memory all-reduce op on
        # first use (~30 s of C++ per machine, a compiler required), which only its inference
        # all-reduce (tensor-parallel inference) calls; ZeRO trains on torch.distributed's
        # collectives. Marked incompatible, so init_distributed skips the build.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend=dist.get_backend(), dist_init_required=False)
    return deepspeed


class DeepSpeedBackend(TrainingBackend):
    """One rank of a DeepSpeed ZeRO engine (stage 2 or 3) with AdamW (DeepSpeedCPUAdam when
    the optimizer is offloaded)."""

    name = "deepspeed"
    match_keys = (*TrainingBackend.match_keys, "zero_stage", "world_size")

    def __init__(self, *args, zero: DeepSpeedConfig | None = None, **kwargs) -> None:
        """TrainingBackend's arguments, and the ZeRO settings (``learner.deepspeed``)."""
        super().__init__(*args, **kwargs)
        dtype, device = self.dtype, self.device
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"model.dtype={dtype} is not supported by the deepspeed backend (no fp16 loss "
                "scaling here); set model.dtype to float32 or bfloat16"
            )
        self.zero = zero or DeepSpeedConfig()
        deepspeed = _import_deepspeed(device)
        module = self._load_module()
        if self.zero.zero_stage == 3 and self.role == "value":
            # ValueModel.forward reads its head's weights without calling the head: have
            # ZeRO-3 gather them with the root module.
            for param in module.head.parameters():
                deepspeed.zero.register_external_parameter(module, param)
        if not self.trainable:  # ZeRO-3 still partitions the parameters; no optimizer
            module.requires_grad_(False)
        self.engine, *_ = deepspeed.initialize(
            model=module,
            optimizer=self._optimizer(module) if self.trainable else None,
            config=self._ds_config(),
            dist_init_required=False,
        )
        self.model = self.engine
        self.module = self.engine.module

    def _optimizer(self, module: torch.nn.Module) -> torch.optim.Optimizer:
        if self.memory.offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(self._trained(module), adamw_mode=True, **self._adam_settings())
        return self._adamw(self._trained(module))

    def _ds_config(self) -> dict[str, Any]:
        """The engine's config; the learning rate is ours (set before every step).

        ``learner.mixed_precision`` stays autocast around an fp32 engine here rather than
        DeepSpeed's ``bf16`` mode (which ``model.dtype=bfloat16`` selects): that mode casts the
        module to bf16 and builds its fp32 master weights from the bf16 copy, so the starting
        weights would be rounded, and weight sync and save_hf would send bf16 values.
        ``learner.reduce_dtype`` is its ``communication_data_type``; ``learner.offload`` its
        optimizer offload, and on ZeRO-3 its parameter offload too."""
        zero: dict[str, Any] = {"stage": self.zero.zero_stage}
        if self.zero.zero_stage == 3:
            zero["stage3_param_persistence_threshold"] = self.zero.param_persistence_threshold
        if self.memory.offload:
            host = {"device": "cpu", "pin_memory": self.device.type == "cuda"}
            zero["offload_optimizer"] = host
            if self.zero.zero_stage == 3:
                zero["offload_param"] = host
        extra: dict[str, Any] = {}
        if self.mixed_precision is not None and self.memory.reduce_dtype == "bfloat16":
            extra["communication_data_type"] = "bf16"
        return {
            **extra,
            "train_micro_batch_size_per_gpu": self.micro,
            "gradient_accumulation_steps": 1,  # the boundary is ours: see _backward
            "train_batch_size": self.micro * self.world_size,
            "gradient_clipping": self.optim_cfg.grad_clip,  # 0: no clipping
            "zero_optimization": zero,
            "bf16": {"enabled": self.dtype == "bfloat16", "check_grad_overflow": True},
            "steps_per_print": 1 << 30,
        }

    def _zero_grad(self) -> None:
        pass  # the engine drops gradients in every step, taken or skipped

    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        # Mini-batches have varying micro-batch counts: mark the last one ourselves.
        self.engine.set_gradient_accumulation_boundary(boundary)
        self.engine.backward(loss)

    def _step(self, lr: float) -> tuple[float, bool]:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float("nan") if norm is None else float(norm), self.engine.was_step_applied()

    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor | None]]:
        if self.zero.zero_stage < 3:  # parameters are whole on every rank
            for name, tensor in self._named_weights():
                yield name, tensor if self.rank == 0 else None
            return
        import deepspeed

        for name, tensor in self._named_weights():
            if not hasattr(tensor, "ds_id"):  # a buffer: never partitioned
                yield name, tensor if self.rank == 0 else None
                continue
            with deepspeed.zero.GatheredParameters([tensor]):  # collective; re-partitions on exit
                yield name, tensor.data.clone() if self.rank == 0 else None

    def _info(self) -> dict[str, Any]:
        return {**super()._info(), "zero_stage": self.zero.zero_stage}

    def _save_shards(self, root: Path) -> None:
        self.engine.save_checkpoint(
            str(root / DS_DIR),
            tag=DS_TAG,
            save_latest=False,
            exclude_frozen_parameters=self.lora is not None,  # LoRA: the base never changes
        )

    def _load_shards(self, root: Path) -> None:
        tag_dir = root / DS_DIR / DS_TAG
        if not tag_dir.is_dir():
            raise BackendCheckpointError(
                f"backend checkpoint {root} has no {DS_DIR}/{DS_TAG}/: it is incomplete or was "
                "not written by the deepspeed backend; load a complete checkpoint"
            )
        check_deepspeed_files(tag_dir)
        loaded, _ = self.engine.load_checkpoint(
            str(root / DS_DIR),
            tag=DS_TAG,
            load_lr_scheduler_states=False,
            load_module_strict=self.lora is None,
        )
        if loaded is None:
            raise BackendCheckpointError(
                f"backend checkpoint {root}: DeepSpeed could not load {tag_dir}; the checkpoint "
                "is incomplete or damaged, load an earlier one"
            )
