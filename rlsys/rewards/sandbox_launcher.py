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
* init builds the jail: a new root (a tmpfs over ``JAIL_ROOT``) holding read-only binds of
  only the paths the spec lists (the interpreter, its standard library, the system library
  directories; their package directories masked), /dev's null, zero, full, random and urandom,
  a fresh /proc, and ``WORK_MOUNT``, a tmpfs of ``disk_mb`` holding ``prog.py``, the one
  writable place; then it pivots into that root and detaches the host's tree;
* init forks the program's process, then watches the whole sandbox: every ``_POLL_S`` it adds
  up the memory (anonymous and shared, then exactly by PSS when that passes the limit, plus
  memfds and SysV segments no process maps) and the CPU time of all its processes (each
  process's last seen, so children nobody waits for count too) and kills them all when a
  total passes the limit; it reports the program's wait status (and ``killed LIMIT``) on the
  status pipe;
* the program's process sets the per-process rlimits, drops to the run's uid when one is
  given, sets no_new_privs and execs the program with the spec's scrubbed environment.

Without isolation the launcher forks the program's process directly. A setup step that
fails writes ``error MESSAGE`` on the status pipe and exits with ``SETUP_FAILED``. With
SPEC ``{"kill_uid": UID}`` it instead kills every process of that uid.

The parent imports this module only for the constants below; this module must never import
the parent or anything else from rlsys.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import json
import os
import resource
import select
import signal
import sys

WORK_MOUNT = "/tmp/work"  # the program's directory inside the jail (a tmpfs of disk_mb)
JAIL_ROOT = "/tmp"  # the host directory the jail's root tmpfs is built over
SETUP_FAILED = 125  # launcher exit status when it could not build the sandbox
_DEVICES = ("null", "zero", "full", "random", "urandom")  # /dev nodes bound into the jail
_POLL_S = 0.01  # how often init adds up the sandbox's memory and CPU time
_FILES_EVERY = 10  # polls between counts of memory held in files (memfd, SysV shm)
_UNKNOWN_PSS = 1 << 62  # smaps_rollup unreadable: trust the resident upper bound
_TICKS = os.sysconf("SC_CLK_TCK")
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_MNT_DETACH = 2
_MAX_FILES = 64  # open files per process (RLIMIT_NOFILE)
_MAX_INODES = 4096  # files and directories in the work directory

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
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 1, 4, 38


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


def _bind_sources(jail: dict) -> list[tuple[str, int, bool]]:
    """(path, O_PATH descriptor, is a directory) of every path bound into the jail, opened
    while the host's tree is still in view."""
    sources = []
    for path in jail["binds"]:
        is_dir = os.path.isdir(path)
        flags = os.O_PATH | (os.O_DIRECTORY if is_dir else 0)
        sources.append((path, os.open(path, flags), is_dir))
    return sources


def _mount_point(path: str, is_dir: bool) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if is_dir:
        os.makedirs(path, mode=0o755, exist_ok=True)
    elif not os.path.exists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def _build_jail(spec: dict) -> None:
    """In the new mount namespace: a root holding only the paths the interpreter needs
    (read-only), the program's directory (a tmpfs of ``disk_mb``), /dev's harmless nodes and a
    fresh /proc; then pivot into it, leaving the host's tree unreachable."""
    jail = spec["jail"]
    with open(os.path.join(spec["workdir"], "prog.py"), "rb") as f:
        program = f.read()
    sources = _bind_sources(jail)
    devices = [(f"/dev/{n}", os.open(f"/dev/{n}", os.O_PATH), False) for n in _DEVICES]
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing propagates to the host
    root = JAIL_ROOT  # the jail's root is a tmpfs mounted over this host directory
    _mount("tmpfs", root, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    for path, fd, is_dir in sources + devices:
        _mount_point(root + path, is_dir)
        _mount(f"/proc/self/fd/{fd}", root + path, None, _MS_BIND | _MS_REC)
        os.close(fd)
    for path, target in jail["symlinks"]:  # e.g. /lib -> usr/lib on merged-/usr systems
        os.makedirs(os.path.dirname(root + path), mode=0o755, exist_ok=True)
        os.symlink(target, root + path)
    for path in jail["masks"]:  # package directories inside the bound library trees
        _mount("tmpfs", root + path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, "size=4k")
    work = root + WORK_MOUNT
    os.makedirs(work, mode=0o755)
    options = f"size={jail['disk_mb']}m,nr_inodes={_MAX_INODES},mode=755"
    _mount("tmpfs", work, "tmpfs", _MS_NOSUID | _MS_NODEV, options)
    prog = os.path.join(work, "prog.py")
    with open(prog, "wb") as f:
        f.write(program)
    os.chmod(prog, 0o644)
    if spec["uid"] is not None:
        os.chown(work, spec["uid"], spec["uid"])
    os.makedirs(root + "/proc", mode=0o755)
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    keep_writable = {work, root + "/proc", *(root + path for path, _, _ in devices)}
    for target, keep in _mount_points():
        if target.startswith(root + "/") and target not in keep_writable:
            flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | keep
            try:
                _mount(None, target, None, flags)
            except OSError as exc:
                if exc.errno != errno.ENOENT:  # ENOENT: hidden under a later mount
                    raise
    _mount(None, root, None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    os.chdir(root)
    _pivot_root_here()
    _libc_call("umount2", b".", _MNT_DETACH)  # the host's tree, stacked on top by pivot_root
    os.chdir("/")


def _pivot_root_here() -> None:
    """pivot_root(".", "."): the current directory becomes the root (glibc has no wrapper)."""
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown system call on {os.uname().machine}")
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    if _libc.syscall(number, b".", b".") != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pivot_root: {os.strerror(err)}")


def _set_limits(limits: dict) -> None:
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    mib = 1024 * 1024
    for rlimit, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU, then SIGKILL a second later
        (resource.RLIMIT_AS, (limits["memory_mb"] * mib,) * 2),
        (resource.RLIMIT_NPROC, (limits["max_processes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["file_size_mb"] * mib,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NOFILE, (_MAX_FILES, _MAX_FILES)),  # bounds memfds it can hold
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
    """PID 1 of the sandbox (isolated mode): builds the jail, runs the program, holds the
    whole sandbox to its memory and CPU limits, and reports the program's wait status."""
    _libc_call("prctl", _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _libc_call("prctl", _PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program cannot ptrace init
    # PID 1 gets only the signals it handles: with none handled, the program (the same uid
    # in a user namespace) cannot interrupt init to hide a verdict
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _build_jail(spec)
    pid = os.fork()
    if pid == 0:
        _guarded(spec["status_fd"], _exec_program, spec)
    status, exceeded = _watch(pid, spec["limits"])
    if exceeded:
        os.write(spec["status_fd"], f"killed {exceeded}\n".encode())
    os.write(spec["status_fd"], f"status {status}\n".encode())
    os._exit(0)


def _watch(pid: int, limits: dict) -> tuple[int, str | None]:
    """Wait for the program (``pid``), reaping every orphan; every ``_POLL_S`` add up the
    sandbox's memory and CPU time over all its processes and kill them all once a total
    passes ``memory_mb`` or ``cpu_s``. Returns (wait status, the limit passed)."""
    memory_limit = limits["memory_mb"] * 1024 * 1024
    cpu_limit = limits["cpu_s"] * _TICKS
    cpu: dict[tuple[str, bytes], int] = {}  # (pid, start time) -> CPU ticks when last seen
    unmapped = 0  # memfd and SysV memory no process maps (refreshed every _FILES_EVERY)
    pidfd = os.pidfd_open(pid)
    for poll in itertools.count():
        select.select([pidfd], [], [], _POLL_S)
        while True:  # reap: the program, or orphans that init inherited
            try:
                done, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                done = 0
            if done == pid:
                return status, None
            if done == 0:
                break
        pids = [name for name in os.listdir("/proc") if name.isdigit() and name != "1"]
        resident = _resident(pids, cpu)
        if poll % _FILES_EVERY == 0:
            unmapped = _unmapped(pids)
        exceeded = None
        if resident + unmapped > memory_limit and _proportional(pids) + unmapped > memory_limit:
            exceeded = "memory"
        elif sum(cpu.values()) > cpu_limit:
            exceeded = "cpu_time"
        if exceeded:
            _kill_all()
            return os.waitpid(pid, 0)[1], exceeded


def _resident(pids: list[str], cpu: dict[tuple[str, bytes], int]) -> int:
    """Anonymous + shared-memory resident bytes of ``pids`` summed (an upper bound: pages
    shared after a fork count in each process); records each one's CPU ticks in ``cpu``, kept
    after it exits (its parent may not wait for it, so no cutime would hold them)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            with open(f"/proc/{pid}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue  # it exited meanwhile
        cpu[(pid, fields[19])] = int(fields[11]) + int(fields[12])  # utime + stime
        for line in status.split(b"\n"):
            if line.startswith((b"RssAnon:", b"RssShmem:")):
                total += int(line.split()[1]) * 1024
    return total


def _proportional(pids: list[str]) -> int:
    """Anonymous + shared-memory bytes of ``pids`` with each shared page divided among its
    sharers (PSS): exact, but costly, so read only when ``_resident`` passes the limit."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                rollup = f.read()
        except OSError:
            continue
        for line in rollup.split(b"\n"):
            if line.startswith((b"Pss_Anon:", b"Pss_Shmem:")):
                total += int(line.split()[1]) * 1024
    return total or _UNKNOWN_PSS


def _unmapped(pids: list[str]) -> int:
    """Bytes of memory the sandbox holds without mapping it: memfds its processes keep open
    (each file once) and SysV segments of its IPC namespace that no process attaches."""
    files: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(path).startswith("/memfd:"):
                    st = os.stat(path)
                    files[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            except OSError:
                continue
    total = sum(files.values())
    try:
        with open("/proc/sysvipc/shm", "rb") as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        rows = []
    for row in rows:  # key shmid perms size cpid lpid nattch ... rss swap
        columns = row.split()
        if len(columns) > 6 and columns[6] == b"0":
            total += int(columns[3])
    return total


def _kill_all() -> None:
    """SIGKILL every process of the sandbox's PID namespace but init."""
    try:  # noqa: SIM105 - contextlib would cost startup time
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
