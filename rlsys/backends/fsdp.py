"""FSDP2 training backend: ``fully_shard`` per decoder layer, AdamW, DCP checkpoints; mixed
precision as FSDP2's ``MixedPrecisionPolicy`` and host offload as its ``CPUOffloadPolicy``.

The batch loop, loss weighting, schedule and forward passes live in ``TrainingBackend``;
this module wraps the model and owns backward, the clipped step, gathering and the sharded
checkpoint (torch.distributed.checkpoint, which reshards to any world size on load).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlsys.backends.base import TrainingBackend
from rlsys.backends.checkpoint import (
    DCP_DIR,
    BackendCheckpointError,
    check_dcp_metadata,
    failure_cause,
    safe_load_planner,
)
from rlsys.models.blocks import decoder_layers

log = logging.getLogger(__name__)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _buffers_to(model: torch.nn.Module, device: torch.device) -> None:
    """Move ``model``'s buffers (rotary frequencies) to ``device``, leaving its parameters
    where FSDP2's offload policy put them (host memory)."""
    for module in model.modules():
        for name, buffer in module.named_buffers(recurse=False):
            module._buffers[name] = buffer.to(device)


class FSDP2Backend(TrainingBackend):
    """One rank of an FSDP2-sharded model (every decoder layer and the root sharded over all
    ranks) and its AdamW optimizer. On one rank there is nothing to shard and the plain module
    trains: FSDP2's hooks and DTensor dispatch cost a small model about a quarter of its step
    for nothing. The checkpoint is the same DCP layout either way, so a run resumes at another
    world size. A GPU learner with ``learner.offload`` is sharded at any world size (FSDP2 does
    the offloading); mixed precision on a sharded model is FSDP2's (``_shard_options``)."""

    name = "fsdp2"

    def __init__(self, *args, **kwargs) -> None:  # TrainingBackend's arguments
        super().__init__(*args, **kwargs)
        # Offloading needs FSDP2 even on one GPU; on a CPU learner there is nothing to move
        offload = self.memory.offload and self.device.type == "cuda"
        if self.memory.offload and not offload:
            log.info("learner.offload=true on a CPU learner: everything is in host memory already")
        model = self._load_module()
        if not offload:  # offloaded, the parameters stay on the host: only buffers move
            model.to(self.device)
        if not self.trainable:
            model.requires_grad_(False)
        if self.world_size > 1 or offload:
            mesh = init_device_mesh(self.device.type, (self.world_size,))
            options = self._shard_options(offload)
            for layer in decoder_layers(model):
                fully_shard(layer, mesh=mesh, **options)
            fully_shard(model, mesh=mesh, **options)
            if "mp_policy" in options:  # bf16 parameters: autocast would only re-cast
                self.autocast_dtype = None
        if offload:
            _buffers_to(model, self.device)
        self.model = self.module = model
        self.optimizer = self._adamw(self._trained(model)) if self.trainable else None

    def _shard_options(self, offload: bool) -> dict:
        """``fully_shard``'s policies. With mixed precision FSDP2 casts the parameters itself:
        it all-gathers them in bf16 (half the traffic and the unsharded memory of fp32), the
        layers compute in bf16, gradients reduce-scatter in ``reduce_dtype`` into the fp32
        shards, and AdamW steps those fp32 master weights. Log-probabilities stay fp32: the
        bf16 logits are cast up before the log-sum-exp (rlsys/models/logprobs.py)."""
        options: dict = {}
        if self.mixed_precision is not None:
            options["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=getattr(torch, self.mixed_precision),
                reduce_dtype=getattr(torch, self.memory.reduce_dtype),
            )
        if offload:
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        return options

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        loss.backward()

    def _step(self, lr: float) -> tuple[float, bool]:
        max_norm = self.optim_cfg.grad_clip or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        norm = float(_full(norm))
        stepped = bool(np.isfinite(norm))
        if stepped:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, stepped

    def _state_dicts(self) -> tuple[dict, dict]:
        """Model and optimizer state as DCP saves and loads them; with LoRA the frozen base is
        left out (it is the model at model_path, never changed)."""
        options = StateDictOptions(ignore_frozen_params=self.lora is not None)
        return get_state_dict(self.model, self.optimizer, options=options)

    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor | None]]:
        for name, tensor in self._named_weights():
            full = _full(tensor)  # collective for a sharded parameter
            yield name, full if self.rank == 0 else None

    def _save_shards(self, root: Path) -> None:
        model_state, optim_state = self._state_dicts()
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(root / DCP_DIR))

    def _load_shards(self, root: Path) -> None:
        # Shapes come from this (possibly differently sharded) model; DCP reshards into them.
        check_dcp_metadata(root / DCP_DIR)
        model_state, optim_state = self._state_dicts()
        state = {"model": model_state, "optim": optim_state}
        try:
            dcp.load(state, checkpoint_id=str(root / DCP_DIR), planner=safe_load_planner())
        except CheckpointException as exc:  # a BaseException: name the first cause plainly
            rank, (cause, _) = next(iter(exc.failures.items()))
            raise BackendCheckpointError(
                f"backend checkpoint {root}: loading the model/optimizer state failed on rank "
                f"{rank} ({failure_cause(cause)}); the checkpoint is incomplete or damaged, load "
                "an earlier one"
            ) from exc
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=StateDictOptions(
                ignore_frozen_params=self.lora is not None, strict=self.lora is None
            ),
        )
