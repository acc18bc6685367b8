"""Resumable checkpoints of a run: written atomically, verified on read, the last N kept.

Layout (``<run_dir>/checkpoints/``)::

    step_000050/
      policy/          the policy learner's sharded model + optimizer + RNG (its backend's format)
      critic/          the critic's, when the run has one
      trainer.json     the controller: step, policy version, sampler position, buffer counters
      trainer.npz      and queued groups, loop counters, KL coefficient, RNG, tracker run id
                       (JSON + numpy arrays, read without pickle: see rlsys/checkpoint/state_file.py)
      hf/              the policy as a Hugging Face directory (checkpoint.save_hf=true only)
      manifest.json    written last: every file with its size; a directory without a valid
                       one is incomplete and is never loaded
    final/             the policy as a Hugging Face directory, at the end of the run
    best/              the policy of the best validation accuracy (eval.validation_prompts:
                       rlsys/trainers/rl/selection.py), never listed, loaded or pruned here

A checkpoint is assembled in ``.tmp-step_<N>`` beside its final name, every file fsynced,
then renamed into place, so a crash leaves either the complete checkpoint or none; a
``.tmp-`` entry left over (a directory, a file or a symlink) is removed at the next save and
never read. The directory must be on storage every learner rank can write (one node, or a
shared file system).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from rlsys.checkpoint.state_file import StateFileError, read_state, write_state

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer.json"  # and trainer.npz beside it (rlsys.checkpoint.state_file)
_PICKLED_STATE = "trainer.pkl"  # what rlsys before state_file wrote; never read
PREFIX = "step_"
TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was asked for."""


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root`` (and ``root``) to disk."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(root: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``root`` (the manifest excluded)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if rel != MANIFEST:
                out[rel] = path.stat().st_size
    return out


def step_of(path: Path) -> int:
    """The learner step a checkpoint directory was taken after."""
    return int(path.name.removeprefix(PREFIX))


def _is_step_dir(name: str) -> bool:
    return name.startswith(PREFIX) and name.removeprefix(PREFIX).isdigit()


def problem(path: Path) -> str | None:
    """Why the checkpoint at ``path`` cannot be used, or None if it is complete."""
    manifest = path / MANIFEST
    if not manifest.is_file():
        return f"no {MANIFEST} (the save did not finish)"
    try:
        expected = json.loads(manifest.read_text())["files"]
        if not isinstance(expected, dict):
            raise TypeError(f"files is a {type(expected).__name__}, not a dict")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    except RecursionError:  # nested thousands deep: no manifest rlsys wrote
        return f"unreadable {MANIFEST}: nested too deep"
    for rel, size in expected.items():
        file = path / rel
        if not file.is_file():
            return f"{rel} is missing"
        if file.stat().st_size != size:
            return f"{rel} has {file.stat().st_size} bytes, the manifest says {size}"
    return None


class CheckpointStore:
    """The ``step_<N>`` checkpoints of one run directory."""

    def __init__(self, root: Path, keep: int) -> None:
        self.root, self.keep = root, keep

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call ``write(tmp_dir)`` to fill a new checkpoint, then make it ``step_<N>``
        atomically and delete the oldest beyond ``keep``; returns its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{PREFIX}{step:06d}"
        tmp = self.root / f"{TMP_PREFIX}{final.name}"
        _remove_stray(tmp)
        tmp.mkdir()
        started = time.perf_counter()
        write(tmp)
        manifest = {"step": step, "time": time.time(), "files": _files(tmp)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        fsync_tree(tmp)
        if final.exists():  # the same step saved again (e.g. after a recovery): replace it
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_dir(self.root)
        log.info("checkpoint %s saved (%.1fs)", final, time.perf_counter() - started)
        self._prune()
        return final

    def saved(self) -> list[Path]:
        """Every ``step_<N>`` directory, complete or not, newest first."""
        if not self.root.is_dir():
            return []
        return sorted(
            (p for p in self.root.iterdir() if p.is_dir() and _is_step_dir(p.name)),
            key=step_of,
            reverse=True,
        )

    def complete(self) -> list[Path]:
        """Usable checkpoints, newest first; incomplete or damaged ones are logged and
        skipped."""
        usable = []
        for path in self.saved():
            reason = problem(path)
            if reason is None:
                usable.append(path)
            else:
                log.warning("checkpoint %s is not usable (%s): skipping it", path, reason)
        return usable

    def latest(self) -> Path | None:
        found = self.complete()
        return found[0] if found else None

    def _prune(self) -> None:
        for old in self.complete()[self.keep :]:
            shutil.rmtree(old, ignore_errors=True)
        for tmp in self.root.glob(f"{TMP_PREFIX}*"):  # left by a crash mid-save
            _remove_stray(tmp)


def _remove_stray(path: Path) -> None:
    """Remove a leftover temporary entry: a directory with what it holds, a file, or a
    symlink itself (never what it points to)."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path)  # does not follow symlinks inside
    except OSError as exc:  # the mkdir or rename after it names the path if it is still there
        log.warning("could not remove %s left from an earlier save: %s", path, exc)


def write_trainer_state(path: Path, state: dict) -> None:
    """Write the controller's ``state`` into the checkpoint directory ``path``."""
    write_state(path / TRAINER_STATE, state)


def read_trainer_state(path: Path) -> dict:
    """The controller state of the checkpoint at ``path``, read without running any of its
    content; CheckpointError names the file and the reason when it cannot be used."""
    if not (path / TRAINER_STATE).is_file() and (path / _PICKLED_STATE).is_file():
        raise CheckpointError(
            f"{path} holds {_PICKLED_STATE}, the controller state of an older rlsys, as a "
            "pickle, which can run code when read: rlsys does not read it. Resume it with the "
            "rlsys that wrote it, or start a fresh run"
        )
    try:
        state = read_state(path / TRAINER_STATE)
    except StateFileError as exc:
        raise CheckpointError(str(exc)) from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{path / TRAINER_STATE} holds a {type(state).__name__}, not a dict")
    return state


def resolve_resume(
    resume: str, output_dir: str, run_name: str | None
) -> tuple[Path, Path | None] | None:
    """Where to resume: (run directory, the checkpoint asked for or None for its latest).

    ``auto`` is run.name's directory if given, else the run under ``output_dir`` with the
    newest complete checkpoint (None if no run has a checkpoint: start fresh; an error if
    runs have checkpoints but none is complete, so a damaged run is never started over). A
    path is a run directory, or one ``checkpoints/step_<N>`` inside it."""
    if resume != "auto":
        path = Path(resume).expanduser().resolve()
        chosen = path if path.name.startswith(PREFIX) else None
        run_dir = path.parent.parent if chosen else path
        if not (run_dir / "checkpoints").is_dir():
            raise CheckpointError(
                f"resume={resume}: {run_dir} is not a run directory with checkpoints/; pass "
                "resume=auto, a run directory or a checkpoints/step_<N> directory"
            )
        return run_dir, chosen
    root = Path(output_dir).expanduser().resolve()
    candidates = [root / run_name] if run_name else (root.iterdir() if root.is_dir() else [])
    newest: dict[Path, float] = {}
    unusable: list[Path] = []
    for run_dir in candidates:
        store = CheckpointStore(run_dir / "checkpoints", 1)
        latest = store.latest()
        if latest is not None:
            newest[run_dir] = (latest / MANIFEST).stat().st_mtime
        else:
            unusable += store.saved()
    if newest:
        return max(newest, key=newest.get), None
    if unusable:
        raise CheckpointError(
            f"resume=auto: no checkpoint of {[str(p) for p in unusable]} is complete (see the "
            "warnings above), so there is nothing to resume and rlsys will not start a fresh "
            "run over them; resume=<run dir>/checkpoints/step_<N> to pick one, or move the run "
            "directory away to start fresh"
        )
    return None
