"""What one sandboxed run gives back to the parent (``sandbox.py``): its stdout and stderr,
read from their pipes as it runs, and the launcher's report on the status pipe, with why the
run was stopped."""

from __future__ import annotations

import contextlib
import os
import select
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import subprocess

_READ_CHUNK = 1 << 20  # bytes asked of an output pipe per read (it returns what it holds)


class Capture:
    """One output pipe: its first ``limit`` bytes kept, the rest read and dropped (so that the
    program never blocks on a full pipe), ``cut`` set when there was more."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd, self.limit = fd, limit
        self.data = bytearray()
        self.cut = False
        self.open = True
        os.set_blocking(fd, False)

    def read(self) -> None:
        """Read what the pipe holds now (at most one pipe's worth)."""
        try:
            chunk = os.read(self.fd, _READ_CHUNK)
        except BlockingIOError:
            return
        self.open = bool(chunk)
        room = self.limit - len(self.data)
        self.data += chunk[: max(0, room)]
        self.cut = self.cut or len(chunk) > room

    def drain(self) -> None:
        """After the run: what is left in the pipe, up to the limit (a process that outlived
        the run, unjailed, may write for ever)."""
        while self.open and not self.cut:
            before = len(self.data)
            self.read()
            if len(self.data) == before:
                return

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def exit_watch(proc: subprocess.Popen) -> int | None:
    """A descriptor readable once ``proc`` exits (None where pidfds are missing: then
    ``read_output`` wakes every ``sandbox._CANCEL_POLL_S``)."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None


def read_output(captures: list[Capture], exited: int | None, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for output or the launcher's exit; read what came."""
    poller = select.poll()
    for capture in captures:
        if capture.open:
            poller.register(capture.fd, select.POLLIN)
    if exited is not None:
        poller.register(exited, select.POLLIN)
    ready = {fd for fd, _ in poller.poll(max(0.0, timeout_s) * 1000)}
    for capture in captures:
        if capture.fd in ready:
            capture.read()


def read_report(status_r: int) -> tuple[str, int | None, str | None]:
    """The launcher's report lines: ``error MESSAGE``, ``status WAIT_STATUS`` and ``killed
    LIMIT`` (the whole sandbox passed LIMIT: memory | cpu_time)."""
    os.set_blocking(status_r, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(status_r, 4096):
            data += chunk
    os.close(status_r)
    errors, status, exceeded = [], None, None
    for line in data.decode(errors="replace").splitlines():
        kind, _, value = line.partition(" ")
        if kind == "error":
            errors.append(value)
        elif kind == "status" and value.isdigit():
            status = int(value)
        elif kind == "killed" and value in ("memory", "cpu_time"):
            exceeded = value
    return "; ".join(errors), status, exceeded


def killed_reason(rc: int, timed_out: bool, setup_failed: bool) -> str | None:
    if setup_failed:
        return "sandbox_error"
    if timed_out:
        return "wall_time"
    if rc == -signal.SIGXCPU:
        return "cpu_time"
    if rc == -signal.SIGXFSZ:
        return "file_size"
    if rc < 0:
        try:
            return f"signal:{signal.Signals(-rc).name}"
        except ValueError:
            return f"signal:{-rc}"
    return None
