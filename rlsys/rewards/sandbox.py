"""Run model-written Python under ``reward.sandbox`` limits, with no network, no writable
file outside its own directory and no inherited secrets.

This module is the parent side (``run_sandboxed``, run in the trainer or a reward worker):
it prepares the run's files, claims a uid, starts the launcher, enforces the wall clock and
reads the results back (``sandbox_output.py``). The child side, the launcher that builds the
sandbox and execs the program, is ``sandbox_launcher.py`` (with ``sandbox_seccomp.py`` and
``sandbox_watch.py``): a separate script that imports only a few standard library modules,
so that each run starts fast.

How one run is contained (Linux):

* The parent starts ``sandbox_launcher.py`` as a script in a new session. The launcher
  unshares network, mount, PID and IPC namespaces (plus a user namespace when not root)
  and forks the *init* of the new PID namespace: when init dies, every process in the
  sandbox dies with it, so a fork bomb cannot outlive its run.
* Init builds a jail and pivots into it: a new root holding, read-only and at their own
  paths, only what ``jail_paths()`` lists (the interpreter, its standard library, the system
  libraries), five /dev nodes, a fresh read-only /proc that shows only the program's own
  processes, and the program's directory (``/tmp/work``, a tmpfs of ``disk_mb``, the one
  writable place).
* Init forks the program's process, which sets the rlimits (CPU, address space,
  processes, file size, open files, no core files) and enters a user namespace of its own
  that owns none of the jail's namespaces; its ids there (``_program_ids``) are, as root, an
  unprivileged uid (one per concurrent run, so RLIMIT_NPROC counts only this run), so that
  even a program that regained root there is nobody to the host. It joins a fresh session
  keyring, sets no_new_privs and a seccomp filter (io_uring, bpf, perf events, userfaultfd,
  mounts, ptrace, new namespaces, netlink and vsock sockets, device nodes, keyrings...:
  ``sandbox_seccomp.deny_syscalls``) and execs ``python -I -S -B prog.py`` with a
  scrubbed environment. Init then holds the whole sandbox to ``memory_mb`` and ``cpu_s``
  (``sandbox_watch.watch``).
* The parent kills the launcher's process group after ``wall_s``; init dies with it.

Where namespaces cannot be created the run is refused unless
``reward.sandbox.unsafe_no_isolation`` is true; then only the rlimits, the uid and the
process-group kill apply. ``sandbox_support()`` says which mode this machine gets.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlsys.rewards.sandbox_launcher import WORK_MOUNT
from rlsys.rewards.sandbox_output import (
    Capture,
    exit_watch,
    killed_reason,
    read_output,
    read_report,
)
from rlsys.rewards.scoring import abandoned

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rlsys.config.reward import SandboxConfig

OUTPUT_LIMIT = 64 * 1024  # bytes of stderr kept; of stdout by default (``stdout_limit``)
_UID_BASE = 2_000_000_000  # per-run uids when root: a block no account uses
_UID_SLOTS = 256  # concurrent runs per machine before runs wait for a free uid
_NOBODY = 65534  # the shared fallback where such uids cannot be set
_CANCEL_POLL_S = 0.05  # how often a waiting run checks whether its reward call was abandoned
_LAUNCHER = str(Path(__file__).absolute().with_name("sandbox_launcher.py"))  # child side
_PATH = "/usr/local/bin:/usr/bin:/bin"
_PACKAGE_DIRS = ("site-packages", "dist-packages")  # masked inside the jail
# System library directories and the loader's cache, bound into the jail where they exist.
_SYSTEM_LIBS = (
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
    "/etc/ld.so.cache",
)


@dataclass
class SandboxResult:
    """The outcome of one sandboxed run; never an exception for bad code."""

    returncode: int  # exit status; negative: killed by that signal
    stdout: str  # the first ``stdout_limit`` bytes, decoded with replacement
    stderr: str
    timed_out: bool  # killed after reward.sandbox.wall_s
    # Why it was stopped: wall_time | cpu_time | memory | file_size | signal:NAME | cancelled
    # (its reward call was abandoned) | sandbox_error
    killed_reason: str | None
    duration_s: float
    truncated: bool = False  # stdout or stderr was longer than its limit
    stdout_truncated: bool = False  # stdout was: the program's answer is not all there

    @property
    def ok(self) -> bool:
        """Whether the program ran to a zero exit status in time."""
        return self.returncode == 0 and not self.timed_out and self.killed_reason is None


@dataclass(frozen=True)
class SandboxSupport:
    """What this machine's sandbox can do, found once by running a trivial program."""

    runs: bool  # a trivial program runs at all
    isolated: bool  # namespaces + read-only filesystem (no network, writes only in cwd)
    uid_mode: str  # pool: a uid per concurrent run | nobody: 65534 | self: the current user
    reason: str = ""  # why a better mode failed


_support: SandboxSupport | None = None
_support_lock = threading.Lock()


def sandbox_support() -> SandboxSupport:
    """The sandbox mode of this machine (probed on first call, then cached)."""
    global _support
    with _support_lock:
        if _support is None:
            _support = _probe()
        return _support


def check_sandbox(cfg: SandboxConfig) -> None:
    """Raise ConfigError when code cannot run here as ``reward.sandbox`` requires."""
    from rlsys.config.errors import ConfigError

    support = sandbox_support()
    if not support.runs:
        raise ConfigError(
            f"the code sandbox cannot start Python on this machine ({support.reason}); "
            "run code rewards (task.reward=code_tests) on a Linux host or reward worker "
            "where it can"
        )
    if not support.isolated and not cfg.unsafe_no_isolation:
        fix = (
            "enable user namespaces (sysctl user.max_user_namespaces > 0)"
            if os.geteuid() == 0
            else "run as root or enable unprivileged user namespaces"
        )
        raise ConfigError(
            f"the code sandbox cannot jail programs here ({support.reason}); {fix}, or set "
            "reward.sandbox.unsafe_no_isolation=true to run the code anyway, unjailed and "
            "online, with only rlimits and an unprivileged user"
        )


def run_sandboxed(
    code: str, stdin: str, cfg: SandboxConfig, stdout_limit: int = OUTPUT_LIMIT
) -> SandboxResult:
    """Run the Python program ``code`` on ``stdin`` under ``cfg``'s limits, keeping the first
    ``stdout_limit`` bytes of its stdout; raises only when this machine cannot sandbox as
    ``cfg`` requires (see ``check_sandbox``)."""
    check_sandbox(cfg)
    return _execute(code, stdin, cfg, sandbox_support(), True, stdout_limit)


def _probe() -> SandboxSupport:
    from rlsys.config.reward import SandboxConfig

    cfg = SandboxConfig(wall_s=60.0, cpu_s=30.0)
    uid_modes = ("pool", "nobody") if os.geteuid() == 0 else ("self",)
    reasons = []
    for isolated in (True, False):
        for uid_mode in uid_modes:
            support = SandboxSupport(True, isolated, uid_mode)
            result = _execute("print('ok')", "", cfg, support)
            if result.returncode == 0 and result.stdout.strip() == "ok":
                return SandboxSupport(True, isolated, uid_mode, "; ".join(reasons))
            detail = (result.stderr.strip() or f"exit status {result.returncode}")[-300:]
            reasons.append(f"{'isolated' if isolated else 'plain'}/{uid_mode}: {detail}")
    return SandboxSupport(False, False, uid_modes[-1], "; ".join(reasons))


def _execute(
    code: str,
    stdin: str,
    cfg: SandboxConfig,
    support: SandboxSupport,
    cancellable: bool = False,
    stdout_limit: int = OUTPUT_LIMIT,
) -> SandboxResult:
    """One run; ``cancellable``: stop it when its reward call is abandoned (never for the
    probe, whose verdict is cached for the process)."""
    start = time.monotonic()
    io_dir = tempfile.mkdtemp(prefix="rlsys-sandbox-io-")  # parent-only: the stdin file
    workdir = tempfile.mkdtemp(prefix="rlsys-sandbox-")
    try:
        with _claim_uid(support.uid_mode) as uid:
            result = _run_launcher(
                code, stdin, cfg, support, uid, workdir, io_dir, cancellable, stdout_limit
            )
            if uid is not None and not support.isolated:
                _kill_uid(uid)  # processes that left the process group
    finally:
        _remove_tree(workdir)
        _remove_tree(io_dir)
    result.duration_s = time.monotonic() - start
    return result


def _run_launcher(
    code: str,
    stdin: str,
    cfg: SandboxConfig,
    support: SandboxSupport,
    uid: int | None,
    workdir: str,
    io_dir: str,
    cancellable: bool,
    stdout_limit: int,
) -> SandboxResult:
    """One launcher run, waited for at most ``wall_s``, its stdout and stderr read as it goes."""
    with open(os.path.join(workdir, "prog.py"), "w", encoding="utf-8", errors="replace") as f:
        f.write(code)
    os.chmod(os.path.join(workdir, "prog.py"), 0o644)
    if uid is not None:
        os.chown(workdir, uid, uid)
    stdin_path = os.path.join(io_dir, "stdin")  # read-only to the program: it cannot grow it
    with open(stdin_path, "w", encoding="utf-8", errors="replace") as f:
        f.write(stdin)
    # Pipes, never host files: a file would let the program hold host disk (fallocate skips
    # RLIMIT_FSIZE) and would be read only after the run.
    (out_r, out_w), (err_r, err_w), (status_r, status_w) = os.pipe(), os.pipe(), os.pipe()
    start = time.monotonic()
    spec = _launch_spec(cfg, support, uid, workdir, status_w)
    timed_out = False
    try:
        with open(stdin_path, "rb") as fin:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _LAUNCHER, json.dumps(spec)],
                stdin=fin,
                stdout=out_w,
                stderr=err_w,
                env={"PATH": _PATH, "LC_ALL": "C.UTF-8"},
                pass_fds=(status_w,),
                start_new_session=True,
            )
    except OSError as exc:
        for fd in (out_r, err_r, status_r):
            os.close(fd)
        return SandboxResult(-1, "", f"cannot start the sandbox: {exc}", False, "sandbox_error", 0)
    finally:
        for fd in (out_w, err_w, status_w):
            os.close(fd)
    stdout, stderr = Capture(out_r, stdout_limit), Capture(err_r, OUTPUT_LIMIT)
    try:
        deadline = start + cfg.wall_s
        exited = exit_watch(proc)
        while proc.poll() is None and not timed_out and not (cancellable and abandoned()):
            read_output([stdout, stderr], exited, min(_CANCEL_POLL_S, deadline - time.monotonic()))
            timed_out = time.monotonic() >= deadline
        cancelled = proc.returncode is None and not timed_out
        # The launcher's session (init takes the rest of the sandbox with it). Once the
        # launcher is reaped its id stays reserved as a process group id while any member lives.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for capture in (stdout, stderr):
            capture.drain()
    finally:
        for fd in (stdout.fd, stderr.fd, *([exited] if exited is not None else [])):
            os.close(fd)
    setup_error, status, exceeded = read_report(status_r)
    # Init (PID 1) cannot die of the program's signal, so it reports the wait status.
    rc = os.waitstatus_to_exitcode(status) if status is not None else proc.returncode
    if timed_out:
        rc = proc.returncode
    err_text = stderr.text()
    if setup_error:
        err_text = f"sandbox setup failed: {setup_error}\n{err_text}"
    if cancelled:
        reason = "cancelled"
    else:
        reason = exceeded or killed_reason(rc, timed_out, bool(setup_error))
    return SandboxResult(
        rc,
        stdout.text(),
        err_text,
        timed_out,
        reason,
        0.0,
        stdout.cut or stderr.cut,
        stdout.cut,
    )


def _launch_spec(
    cfg: SandboxConfig, support: SandboxSupport, uid: int | None, workdir: str, status_fd: int
) -> dict:
    """The launcher's instructions (JSON on its command line; nothing secret in them)."""
    cwd = WORK_MOUNT if support.isolated else workdir
    env = {
        "PATH": _PATH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": cwd,
        "TMPDIR": cwd,
        "PYTHONHASHSEED": "0",  # ignored under -I; kept for programs the program starts
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return {
        "isolate": support.isolated,
        "userns": support.isolated and os.geteuid() != 0,  # the launcher's own, as non-root
        "uid": uid,
        "ids": _program_ids(uid),
        "workdir": workdir,
        "jail": {**jail_paths(), "disk_mb": cfg.disk_mb},
        "cwd": cwd,
        "argv": [_interpreter(), "-I", "-S", "-B", "prog.py"],
        "env": env,
        "limits": {
            "cpu_s": cfg.cpu_s,
            "memory_mb": cfg.memory_mb,
            "max_processes": cfg.max_processes,
            "file_size_mb": cfg.file_size_mb,
        },
        "status_fd": status_fd,
        "parent_pid": os.getpid(),
    }


def _program_ids(uid: int | None) -> dict[str, list[int]]:
    """The program's uid and gid inside its user namespace (isolated runs), each with the id
    it is outside, as ``[inside, outside]``: the run's uid as root (the same number inside,
    so the program is not root there); without root, the user's own ids. As root without a
    uid of the run's own (``uid_mode="self"``, never chosen by ``_probe``: the tests' stand-in
    for a program that regained root) it is the root of its namespace, and nobody outside."""
    if os.geteuid() != 0:
        return {"uid": [os.getuid(), os.getuid()], "gid": [os.getgid(), os.getgid()]}
    if uid is None:
        return {"uid": [0, _NOBODY], "gid": [0, _NOBODY]}
    return {"uid": [uid, uid], "gid": [uid, uid]}


def _interpreter() -> str:
    """The base interpreter (not a virtual environment's link to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


@functools.cache
def jail_paths() -> dict[str, list]:
    """What the jail shows of the host, at the same paths, read-only: ``binds`` (the
    interpreter, its shared library, its standard library and extension modules, the system
    library directories and the loader's cache), ``symlinks`` (top-level links such as
    /lib -> usr/lib, as [path, target]) and ``masks`` (package directories inside those
    trees, covered by empty directories). Nothing else: no datasets, repositories, home
    directories, caches, /etc or other runs."""
    binds, symlinks = {_interpreter()}, []
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        library = os.path.join(libdir, sysconfig.get_config_var("INSTSONAME") or "")
        if os.path.isfile(library):
            binds.add(os.path.realpath(library))
    # the base installation's standard library and extension modules (never sys.path: it
    # may hold the project, its packages or its data)
    for path in (sysconfig.get_paths()["stdlib"], sysconfig.get_config_var("DESTSHARED")):
        if path and os.path.isdir(path):
            binds.add(os.path.realpath(path))
    for path in _SYSTEM_LIBS:
        if os.path.islink(path):
            symlinks.append([path, os.readlink(path)])
        elif os.path.exists(path):
            binds.add(path)
    binds = sorted(b for b in binds if not any(b.startswith(o + os.sep) for o in binds))
    masks = sorted(
        os.path.join(root, name)
        for bound in binds
        if os.path.isdir(bound)
        for root in (bound, *glob.glob(os.path.join(bound, "python*")))
        for name in _PACKAGE_DIRS
        if os.path.isdir(os.path.join(root, name)) and not os.path.islink(os.path.join(root, name))
    )
    return {"binds": binds, "symlinks": symlinks, "masks": masks}


@contextlib.contextmanager
def _claim_uid(uid_mode: str) -> Iterator[int | None]:
    """A uid for one run: ``pool`` holds an flock on one of _UID_SLOTS files (shared by
    every process of this machine) for the run's length."""
    if uid_mode != "pool":
        yield _NOBODY if uid_mode == "nobody" else None
        return
    lock_dir = os.path.join(tempfile.gettempdir(), f"rlsys-sandbox-uids-{os.geteuid()}")
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    st = os.lstat(lock_dir)
    if not os.path.isdir(lock_dir) or os.path.islink(lock_dir) or st.st_uid != os.geteuid():
        raise RuntimeError(f"{lock_dir} is not a directory of this user; remove it")
    while True:
        for slot in random.sample(range(_UID_SLOTS), _UID_SLOTS):
            fd = os.open(os.path.join(lock_dir, str(slot)), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield _UID_BASE + slot
            finally:
                os.close(fd)
            return
        time.sleep(0.01)


def _kill_uid(uid: int) -> None:
    launcher = [sys.executable, "-I", "-S", "-B", _LAUNCHER]
    subprocess.run([*launcher, json.dumps({"kill_uid": uid})], env={}, check=False)


def _remove_tree(path: str) -> None:
    def unlock_and_retry(func, failed_path, _exc) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed_path), 0o700)
            func(failed_path)

    shutil.rmtree(path, onerror=unlock_and_retry)
