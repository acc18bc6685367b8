"""The files of a backend checkpoint that do not depend on the backend, and their I/O.

A backend checkpoint is one directory that every rank can see::

    backend.json        who wrote it: backend, zero_stage, role, model_path, dtype, world_size,
                        lora (the adapters' settings, or null)
    state.json          the backend's scalars: optimizer_steps, schedule_start, base_lr,
                        decay_steps, last_lr
    rng/rank_<r>.pt     rank r's torch RNG state (CPU, and CUDA on a GPU rank)
    dcp/                FSDP2: model + optimizer, sharded (torch.distributed.checkpoint)
    deepspeed/          DeepSpeed: engine.save_checkpoint(tag="state") (ZeRO partitions)

With LoRA the model state is the adapters alone (the frozen base is model_path's).

Every file is fsynced before the save returns; the caller makes the directory appear
atomically (a rename) and fsyncs its parent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from rlsys.checkpoint.store import CheckpointError

BACKEND_INFO = "backend.json"
SCALARS = "state.json"
RNG_DIR = "rng"
DCP_DIR = "dcp"  # FSDP2's model + optimizer state, sharded: {"model": ..., "optim": ...}
FORMAT_VERSION = 1


# backend.json keys a checkpoint may have to share with the backend loading it, and the fix.
_MATCH_FIXES = {
    "backend": "load it with the backend that wrote it (learner.backend / critic.backend)",
    "role": "a policy checkpoint loads into the policy learner, a value one into the critic",
    "dtype": "set model.dtype to the checkpoint's dtype",
    "lora": "set model.lora.* to the checkpoint's (a LoRA checkpoint holds adapters only; a "
    "full one has no adapters to resume)",
    "zero_stage": "set deepspeed.zero_stage to the checkpoint's stage",
    "world_size": "a DeepSpeed checkpoint loads only into as many ranks as wrote it: set "
    "world_size to the checkpoint's (FSDP2 checkpoints reshard to any world size)",
}


class BackendCheckpointError(CheckpointError):
    """A backend checkpoint that is missing, damaged or written by a different setup."""


def check_compatible(
    root: Path, info: dict[str, Any], mine: dict[str, Any], keys: tuple[str, ...]
) -> None:
    """Raise unless the checkpoint's ``backend.json`` (``info``) equals the loading
    backend's own (``mine``) at every one of ``keys``."""
    for key in keys:
        if info.get(key) != mine[key]:
            raise BackendCheckpointError(
                f"backend checkpoint {root} has {key}={info.get(key)!r}, this learner "
                f"{key}={mine[key]!r}; {_MATCH_FIXES[key]}"
            )


def parse_scalars(root: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """The backend attributes ``state.json`` restores, type-checked."""
    try:
        decay = raw["decay_steps"]
        return {
            "optimizer_steps": int(raw["optimizer_steps"]),
            "schedule_start": int(raw["schedule_start"]),
            "base_lr": float(raw["base_lr"]),
            "decay_steps": None if decay is None else int(decay),
            "last_lr": float(raw["last_lr"]),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise BackendCheckpointError(
            f"backend checkpoint {root}: {SCALARS} lacks a valid {exc}; the checkpoint is "
            "damaged, load an earlier one"
        ) from exc


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` and fsync it."""
    with path.open("w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())


def read_json(root: Path, name: str) -> dict[str, Any]:
    """The JSON file ``name`` of the checkpoint at ``root``; a clear error if it is missing or
    unreadable."""
    path = root / name
    if not root.is_dir():
        raise BackendCheckpointError(
            f"backend checkpoint {root} does not exist (or is not a directory); pass the "
            "directory a save_checkpoint wrote"
        )
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise BackendCheckpointError(
            f"backend checkpoint {root} has no {name}: it is incomplete or not a backend "
            "checkpoint; pass the directory a complete save_checkpoint wrote"
        ) from exc
    except (OSError, ValueError) as exc:
        raise BackendCheckpointError(
            f"backend checkpoint {root}: {name} is unreadable ({exc}); the checkpoint is "
            "damaged, load an earlier one"
        ) from exc


def check_dcp_metadata(dcp_dir: Path) -> None:
    """Refuse a DCP checkpoint whose metadata files (which torch reads with pickle) name
    anything a DCP checkpoint never holds: they could run code (see rlsys.checkpoint.pickle_scan).
    ``.metadata`` must be there: without it DCP would fall back to per-rank files."""
    from rlsys.checkpoint.pickle_scan import DCP_METADATA_GLOBALS, UnsafePickleError, check_pickle

    if not (dcp_dir / ".metadata").is_file():
        raise BackendCheckpointError(
            f"backend checkpoint {dcp_dir.parent} has no {DCP_DIR}/.metadata: the save did "
            "not finish, or the directory is not a DCP checkpoint; load an earlier one"
        )
    for metadata in sorted(dcp_dir.glob("*.metadata")):
        try:
            check_pickle(metadata, DCP_METADATA_GLOBALS, "DCP metadata")
        except UnsafePickleError as exc:
            raise BackendCheckpointError(f"backend checkpoint {dcp_dir.parent}: {exc}") from exc


def check_deepspeed_files(state_dir: Path) -> None:
    """Refuse a DeepSpeed checkpoint any of whose files (read by DeepSpeed with
    ``torch.load(weights_only=False)``) names anything its kind never holds."""
    from rlsys.checkpoint.pickle_scan import DEEPSPEED_GLOBALS, UnsafePickleError, check_torch_file

    for path in sorted(state_dir.glob("*.pt")):
        try:
            check_torch_file(path, DEEPSPEED_GLOBALS, "DeepSpeed checkpoint file")
        except UnsafePickleError as exc:
            raise BackendCheckpointError(f"backend checkpoint {state_dir}: {exc}") from exc


class _WeightsOnlyBytes:
    """DCP planners' byte items (non-tensor state, e.g. optimizer param_groups) read with
    ``torch.load(weights_only=True)``: torch's default planners unpickle them in full, which
    runs whatever a downloaded checkpoint names."""

    def load_bytes(self, read_item, value) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def safe_load_planner(keys: set[str] | None = None):
    """A DCP load planner that reads byte items without full pickle: the default planner,
    or (``keys``) the one that rebuilds those top-level keys from the metadata alone."""
    from torch.distributed.checkpoint.default_planner import (
        DefaultLoadPlanner,
        _EmptyStateDictLoadPlanner,
    )

    if keys is None:
        return type("SafeLoadPlanner", (_WeightsOnlyBytes, DefaultLoadPlanner), {})()
    planner = type("SafeEmptyLoadPlanner", (_WeightsOnlyBytes, _EmptyStateDictLoadPlanner), {})
    return planner(keys=keys)


def dcp_reader(dcp_dir: Path):
    """DCP's file reader for ``dcp_dir`` that remembers which shard file it reads
    (``reading``), so a damaged one can be named (``dcp_read_error``)."""
    from torch.distributed.checkpoint import FileSystemReader

    class ShardNamingReader(FileSystemReader):
        reading: str | None = None

        def _slice_file(self, file, sinfo):  # called for every item, before it is read
            self.reading = sinfo.relative_path
            return super()._slice_file(file, sinfo)

    return ShardNamingReader(str(dcp_dir))


def dcp_read_error(root: Path, exc: BaseException, reader, fix: str) -> BackendCheckpointError:
    """The error for reading the DCP state of the backend checkpoint ``root`` with ``reader``
    (a ``dcp_reader``) failing with ``exc``: the shard file and the cause in one line, then
    ``fix``."""
    shard = getattr(reader, "reading", None)
    where = root / DCP_DIR / shard if shard else root / DCP_DIR
    return BackendCheckpointError(
        f"backend checkpoint {root}: {where} is damaged or incomplete ({failure_cause(exc)}); {fix}"
    )


def failure_cause(exc: BaseException) -> str:
    """``exc`` in a short line: the first rank's error of a DCP CheckpointException (which
    prints every rank's traceback), the first sentence of a long message, and never torch's
    advice to retry with ``weights_only=False`` (which would run a damaged or planted pickle)."""
    failures = getattr(exc, "failures", None)  # torch.distributed.checkpoint's exception
    if isinstance(failures, dict) and failures:
        exc = next(iter(failures.values()))[0]
    text = str(exc).strip()
    if "weights_only" in text:  # torch's weights-only unpickler refused the bytes
        detail = text.partition("WeightsUnpickler error:")[2].strip().splitlines()
        text = "not tensor data" + (f": {detail[0].strip()}" if detail else "")
    line = text.splitlines()[0] if text else ""
    sentence = line.split(". ")[0][:200]
    return f"{type(exc).__name__}: {sentence}" if sentence else type(exc).__name__


def rng_path(root: Path, rank: int) -> Path:
    """Where rank ``rank`` keeps its RNG state."""
    return root / RNG_DIR / f"rank_{rank:05d}.pt"


def save_rng(root: Path, rank: int, device: torch.device) -> None:
    """Write this rank's torch RNG state (CPU, and CUDA on a GPU) and fsync it."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    path = rng_path(root, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def load_rng(root: Path, rank: int, device: torch.device) -> bool:
    """Restore this rank's RNG state; False when the checkpoint has none for this rank (it
    was written by fewer ranks)."""
    path = rng_path(root, rank)
    if not path.is_file():
        return False
    try:
        state = torch.load(path, weights_only=True)
    except Exception as exc:  # torch.load raises many types for a damaged file
        raise BackendCheckpointError(
            f"backend checkpoint {root}: {path} is unreadable ({failure_cause(exc)}); the "
            "checkpoint is damaged, load an earlier one"
        ) from exc
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
    return True
