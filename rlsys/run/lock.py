"""One owner per run directory: the process that trains holds ``<run_dir>/.lock``.

The lock is an exclusive ``flock`` on that file, taken as soon as the run directory is chosen
(``make_run_dir``, or the directory ``resume`` names) and held until the command returns; the
file records the holder's pid, host and start time for the message a second run gets. The OS
drops the lock when the holder exits or dies, so a crashed run's directory is free to resume:
only a live process blocks. ``rlsys scale`` tells a live run from a dead one by the same lock
(``live_holder``). On a cluster it is the process that trains (the Ray job's entrypoint, the
Slurm batch step, the KubeRay submitter's job) that takes it, where the run directory is.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rlsys.config.errors import ConfigError

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# A probe by `rlsys scale` holds the lock (shared) for microseconds: a run that finds it taken
# tries again for this long before it names the holder.
_RETRY_S, _RETRY_EVERY_S = 1.0, 0.05
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # a file system without flock

_held: dict[Path, int] = {}  # run directory -> the descriptor whose lock this process holds


class RunDirInUse(ConfigError):
    """Another live process owns the run directory; the message names it and the fix."""


@dataclass(frozen=True)
class Holder:
    """Who took a run directory's lock (as its ``.lock`` file records it)."""

    pid: int | None
    host: str
    started: str

    def __str__(self) -> str:
        return f"pid {self.pid} on host {self.host} (since {self.started})"


def _read(path: Path) -> Holder:
    try:
        record = json.loads(path.read_text())
        return Holder(record["pid"], record["host"], record["started"])
    except (OSError, ValueError, KeyError, TypeError):  # being written, or not ours
        return Holder(None, "unknown", "unknown")


def _record(fd: int) -> None:
    holder = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode() + b"\n", 0)


def lock_run_dir(run_dir: Path, key: str) -> None:
    """Make this process ``run_dir``'s one owner (a no-op if it already is); raise RunDirInUse
    naming the live holder and ``key`` (the setting that chose the directory) otherwise."""
    run_dir = run_dir.resolve()
    if run_dir in _held:
        return
    path = run_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + _RETRY_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(_RETRY_EVERY_S)
                continue
            os.close(fd)
            raise _in_use(run_dir, key, _read(path)) from None
        except OSError as exc:
            os.close(fd)
            if exc.errno not in _UNSUPPORTED:
                raise
            log.warning(
                "%s: the file system refuses locks (%s), so nothing stops a second run from "
                "using this directory at once; rlsys scale cannot tell that it is live",
                run_dir,
                exc.strerror,
            )
            return
    _record(fd)
    _held[run_dir] = fd


def _in_use(run_dir: Path, key: str, holder: Holder) -> RunDirInUse:
    return RunDirInUse(
        f"{key}: {run_dir} is in use by {holder}: one run directory has one owner "
        f"({run_dir / LOCK_FILE}). Wait for that run to finish (or stop it), or choose another "
        "run.name"
    )


def check_not_in_use(run_dir: Path, key: str) -> None:
    """Raise RunDirInUse if a live process owns ``run_dir`` (without taking its lock: for a
    refusal that must leave the directory as it is)."""
    try:
        holder = live_holder(run_dir)
    except OSError:  # a file system without locks: nothing to tell
        return
    if holder is not None:
        raise _in_use(run_dir, key, holder)


def release_run_dir(run_dir: Path) -> None:
    """Give up ``run_dir``'s lock, if this process holds it (its record stays, for reference)."""
    fd = _held.pop(run_dir.resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the only descriptor releases the flock


F = TypeVar("F", bound=Callable)


def owns_run_dir(command: F) -> F:
    """``command`` (``rlsys train``, ``sft``, ...) gives up the run-directory locks it took when
    it returns or raises (a process that dies loses them anyway)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        before = set(_held)
        try:
            return command(*args, **kwargs)
        finally:
            for run_dir in set(_held) - before:
                release_run_dir(run_dir)

    return wrapper  # type: ignore[return-value]


def live_holder(run_dir: Path) -> Holder | None:
    """The live process that owns ``run_dir``, or None: no lock file (not a run of this
    rlsys), or nobody holds it (the run ended or crashed). OSError where the file system
    refuses locks."""
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released at once by the close below
    except BlockingIOError:
        return _read(path)
    finally:
        os.close(fd)
    return None


def last_holder(run_dir: Path) -> Holder | None:
    """Who held ``run_dir``'s lock last, live or not (None: it has no lock file)."""
    path = run_dir / LOCK_FILE
    return _read(path) if path.is_file() else None
