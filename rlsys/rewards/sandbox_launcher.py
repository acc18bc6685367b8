"""The child side of the code sandbox: the *launcher* script that builds one run's sandbox
and execs the program in it (the parent side, ``run_sandboxed``, is ``sandbox.py``).

The parent starts this file as ``python -I -S -B sandbox_launcher.py SPEC`` (SPEC: JSON
instructions, see ``sandbox._launch_spec``) in a new session, once per run. It is kept
apart from the parent so that each run's interpreter imports only a few standard library
modules (no rlsys, no third-party package, no subprocess/tempfile/dataclasses), which
keeps its start fast. In isolated mode it:

* unshares network, mount, PID and IPC namespaces (plus a user namespace when not root)
  and forks the *init* of the new PID namespace, which dies with the launcher (and takes
  every sandboxed process with it);
* init makes every mount read-only, mounts an empty tmpfs on /tmp holding only the run's
  working directory (``WORK_MOUNT``) and a read-only view of the Python installation
  (``PYTHON_MOUNT``), an empty /run and a fresh /proc, then forks the program's process
  and reports its wait status on the status pipe;
* the program's process sets the rlimits, drops to the run's uid when one is given, sets
  no_new_privs and execs the program with the spec's scrubbed environment.

Without isolation the launcher forks the program's process directly. A setup step that
fails writes ``error MESSAGE`` on the status pipe and exits with ``SETUP_FAILED``. With
SPEC ``{"kill_uid": UID}`` it instead kills every process of that uid.

The parent imports this module only for the constants below; this module must never import
the parent or anything else from rlsys.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import sys

WORK_MOUNT = "/tmp/work"  # the run's working directory, inside the sandbox
PYTHON_MOUNT = "/tmp/python"  # the Python installation, read-only, inside the sandbox
SETUP_FAILED = 125  # launcher exit status when it could not build the sandbox

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT = 1, 2, 4, 8, 32
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18
_MS_KEEP = {  # per-mount flags a bind remount must repeat (locked in a user namespace)
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": 1024,
    "nodiratime": 2048,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38


_libc: ctypes.CDLL | None = None


def _libc_call(name: str, *args) -> None:
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    if getattr(_libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = ""):
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _libc_call("mount", enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3])


def _unescape(field: str) -> str:
    """A mountinfo path with its ``\\ooo`` octal escapes decoded (no ``re``: startup time)."""
    head, *rest = field.split("\\")
    parts = [head]
    for part in rest:
        octal = part[:3]
        if len(octal) == 3 and all(c in "01234567" for c in octal):
            parts.append(chr(int(octal, 8)) + part[3:])
        else:
            parts.append("\\" + part)
    return "".join(parts)


def _mount_points() -> list[tuple[str, int]]:
    """(mount point, flags to keep) of every mount, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            keep = sum(_MS_KEEP.get(opt, 0) for opt in fields[5].split(","))
            points.append((_unescape(fields[4]), keep))
    return points


def _build_filesystem(spec: dict) -> None:
    """In the new mount namespace: everything read-only but WORK_MOUNT, empty /tmp and /run,
    a fresh /proc."""
    work = os.open(spec["workdir"], os.O_PATH | os.O_DIRECTORY)
    home = os.open(spec["python_home"], os.O_PATH | os.O_DIRECTORY)
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing propagates to the host
    for hidden in ("/tmp", "/run"):  # other runs' files, the host's sockets (ro allows connect)
        if hidden == "/tmp" or (os.path.isdir(hidden) and not os.path.islink(hidden)):
            _mount("tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=755")
    for path, fd in ((WORK_MOUNT, work), (PYTHON_MOUNT, home)):
        os.mkdir(path)
        _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
        os.close(fd)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    for target, keep in _mount_points():
        if target == WORK_MOUNT:
            continue
        try:
            _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | keep)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: hidden under a later mount
                raise


def _set_limits(limits: dict) -> None:
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    mib = 1024 * 1024
    for rlimit, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU, then SIGKILL a second later
        (resource.RLIMIT_AS, (limits["memory_mb"] * mib,) * 2),
        (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mib,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(rlimit, value)


def _exec_program(spec: dict) -> None:
    os.chdir(spec["cwd"])
    _set_limits(spec["limits"])
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _libc_call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binaries
    os.set_inheritable(spec["status_fd"], False)  # closes on exec: no message means success
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


def _exit_like(status: int) -> None:
    """Exit as the waited-for child did (the same signal, or the same exit status)."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:  # noqa: SIM105 - contextlib would cost startup time
            signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _guarded(status_fd: int, step, *args) -> None:
    """Run a setup step; on failure report it on the status pipe and exit."""
    try:
        step(*args)
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:2000]
        os.write(status_fd, f"error {message}\n".encode())
        os._exit(SETUP_FAILED)


def _enter_namespaces(spec: dict) -> None:
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC
    _libc_call("unshare", flags | (_CLONE_NEWUSER if spec["userns"] else 0))
    if spec["userns"]:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        with open("/proc/self/gid_map", "w") as f:
            f.write(f"{gid} {gid} 1")


def _init(spec: dict) -> None:
    """PID 1 of the sandbox (isolated mode): builds the filesystem, runs the program."""
    _libc_call("prctl", _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _build_filesystem(spec)
    pid = os.fork()
    if pid == 0:
        _guarded(spec["status_fd"], _exec_program, spec)
    status = os.waitpid(pid, 0)[1]
    os.write(spec["status_fd"], f"status {status}\n".encode())
    os._exit(0)


def _launcher_main(spec: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if "kill_uid" in spec:  # every process of a pool uid (non-isolated runs only)
        os.setuid(spec["kill_uid"])
        try:  # noqa: SIM105 - contextlib would cost startup time
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return
    status_fd = spec["status_fd"]
    _libc_call("prctl", _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the trainer died
    if os.getppid() != spec["parent_pid"]:
        os._exit(SETUP_FAILED)
    if spec["isolate"]:
        _guarded(status_fd, _enter_namespaces, spec)
    pid = os.fork()
    if pid == 0:
        _guarded(status_fd, _init if spec["isolate"] else _exec_program, spec)
    os.close(status_fd)
    _exit_like(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    _launcher_main(json.loads(sys.argv[1]))
