"""FSDP2 training backend: ``fully_shard`` per decoder layer, AdamW, DCP checkpoints.

The batch loop, loss weighting, schedule and forward passes live in ``TrainingBackend``;
this module wraps the model and owns backward, the clipped step, gathering and the sharded
checkpoint (torch.distributed.checkpoint, which reshards to any world size on load).
"""

from __future__ import annotations

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
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from rlsys.backends.base import TrainingBackend
from rlsys.backends.checkpoint import (
    DCP_DIR,
    BackendCheckpointError,
    check_dcp_metadata,
    safe_load_planner,
)
from rlsys.models.blocks import decoder_layers


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class FSDP2Backend(TrainingBackend):
    """One rank of an FSDP2-sharded model (every decoder layer and the root sharded over all
    ranks) and its AdamW optimizer. On one rank there is nothing to shard and the plain module
    trains: FSDP2's hooks and DTensor dispatch cost a small model about a quarter of its step
    for nothing. The checkpoint is the same DCP layout either way, so a run resumes at another
    world size."""

    name = "fsdp2"

    def __init__(self, *args, **kwargs) -> None:  # TrainingBackend's arguments
        super().__init__(*args, **kwargs)
        model = self._load_module().to(self.device)
        if not self.trainable:
            model.requires_grad_(False)
        if self.world_size > 1:
            mesh = init_device_mesh(self.device.type, (self.world_size,))
            for layer in decoder_layers(model):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        self.model = self.module = model
        self.optimizer = self._adamw(self._trained(model)) if self.trainable else None

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
                f"{rank} ({cause}); the checkpoint is incomplete or damaged, load an earlier one"
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
