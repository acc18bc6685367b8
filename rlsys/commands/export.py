"""``rlsys export``: a checkpoint's policy as a Hugging Face (or PEFT adapter) directory."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("rlsys")


def export_policy(checkpoint: str, out_dir: str, merge: bool = False) -> Path:
    """``rlsys export``: the policy of a checkpoint (``checkpoints/step_<N>`` or its
    ``policy/``; a run directory: its latest complete checkpoint) as a Hugging Face
    directory, read straight from the shards; a LoRA run's as a PEFT adapter directory, or
    with ``merge`` as the model with its adapters merged in."""
    from rlsys.backends.export import export_hf
    from rlsys.checkpoint.store import CheckpointError, CheckpointStore, problem

    path = Path(checkpoint).expanduser().resolve()
    if not path.is_dir():
        raise CheckpointError(
            f"{checkpoint} is not a directory; pass a run directory, one of its "
            "checkpoints/step_<N> or a step's policy/"
        )
    if (path / "checkpoints").is_dir() and not (path / "policy").is_dir():
        latest = CheckpointStore(path / "checkpoints", 1).latest()
        if latest is None:
            raise CheckpointError(
                f"run directory {path} has no complete checkpoint to export (see the warnings "
                "above); its checkpoints/final, if there, is already a Hugging Face directory"
            )
        log.info("exporting %s, the latest complete checkpoint of %s", latest.name, path)
        path = latest
    if not any((path / name).exists() for name in ("policy", "backend.json")):
        raise CheckpointError(
            f"{path} is not a run directory, a checkpoint or a policy directory (it has no "
            "checkpoints/, policy/ or backend.json); pass a run directory, one of its "
            "checkpoints/step_<N> or a step's policy/"
        )
    if (path / "policy").is_dir():
        reason = problem(path)
        if reason is not None:
            raise CheckpointError(f"checkpoint {path} is not usable: {reason}")
        path = path / "policy"
    out = Path(out_dir).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(
            f"cannot create the output directory {out_dir} ({exc.strerror}: {exc.filename}); "
            "pass a directory path you can write"
        ) from exc
    try:
        export_hf(str(path), str(out), merge)
    except FileNotFoundError as exc:  # the backend's own errors are CheckpointErrors
        raise CheckpointError(str(exc)) from exc
    return out
