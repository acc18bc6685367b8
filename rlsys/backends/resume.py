"""A backend's checkpoint: what it writes so that a run resumes exactly (sharded model +
optimizer state through the backend's hooks, the learning-rate schedule's scalars, every
rank's RNG state, ``backend.json`` naming the writer), and how it reads one back, refusing a
checkpoint from another backend, role or dtype. The file formats are ``checkpoint.py``'s."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist

from rlsys.backends import checkpoint as ckpt
from rlsys.backends.engine import BackendEngine
from rlsys.checkpoint.store import fsync_tree

log = logging.getLogger(__name__)


class Resumable(BackendEngine):
    """``save_checkpoint`` / ``load_checkpoint`` of one rank (collective)."""

    def save_checkpoint(self, path: str) -> None:
        """Collective: write model + optimizer state (sharded), the schedule scalars, every
        rank's RNG state and ``backend.json`` into the directory ``path`` (which every rank
        sees; created if missing). Every file is fsynced before this returns."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self._save_shards(root)
        ckpt.save_rng(root, self.rank, self.device)
        if self.rank == 0:
            ckpt.write_json(root / ckpt.BACKEND_INFO, self._info())
            ckpt.write_json(root / ckpt.SCALARS, self._scalars())
        dist.barrier()
        fsync_tree(root)  # each rank: its own files are durable whatever FS it is on
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        """Collective: put this backend in exactly the state it had when ``path`` was saved
        (weights, optimizer, schedule, RNG). Raises ``BackendCheckpointError`` naming ``path``
        when it is missing, damaged or from another backend, role, dtype (or, for DeepSpeed,
        ZeRO stage or world size)."""
        root = Path(path)
        info = ckpt.read_json(root, ckpt.BACKEND_INFO)
        scalars = ckpt.parse_scalars(root, ckpt.read_json(root, ckpt.SCALARS))
        ckpt.check_compatible(root, info, self._info(), self.match_keys)
        if info.get("model_path") != self.model_path:
            log.warning(
                "backend checkpoint %s was saved from model %s, this learner started from %s",
                root,
                info.get("model_path"),
                self.model_path,
            )
        try:
            self._load_shards(root)
        except ckpt.BackendCheckpointError:
            raise
        except Exception as exc:
            raise ckpt.BackendCheckpointError(
                f"backend checkpoint {root}: loading the model/optimizer state failed ({exc}); "
                "the checkpoint is damaged or from another model, load an earlier one"
            ) from exc
        for name, value in scalars.items():
            setattr(self, name, value)
        if not ckpt.load_rng(root, self.rank, self.device):
            log.info("backend checkpoint %s has no RNG state for rank %d", root, self.rank)
        dist.barrier()

    def _scalars(self) -> dict[str, Any]:
        return {
            "optimizer_steps": self.optimizer_steps,
            "schedule_start": self.schedule_start,
            "base_lr": self.base_lr,
            "decay_steps": self.decay_steps,
            "last_lr": self.last_lr,
        }
