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
  a fresh /proc (``hidepid``: the program sees only its own processes; read-only once the
  program's id maps are written), and ``WORK_MOUNT``, a tmpfs of ``disk_mb`` holding
  ``prog.py``, the one writable place; then it pivots into that root and detaches the host's
  tree;
* init forks the program's process, then watches the whole sandbox (``sandbox_watch.py``):
  every ``_POLL_S`` it adds up the memory (anonymous and shared, then exactly by PSS when that
  passes the limit, plus memfds and SysV segments no process maps) and the CPU time of all its
  processes (each process's last seen, so children nobody waits for count too) and kills them
  all when a total passes the limit; it reports the program's wait status (and ``killed
  LIMIT``) on the status pipe;
* the program's process sets the per-process rlimits, enters a user namespace of its own
  (one that owns none of the jail's namespaces, so that even its root can change no mount,
  network or process of the jail) where init maps its ids (``ids``: as root, the run's
  unprivileged uid), joins a fresh session keyring, sets no_new_privs and a seccomp filter
  (``sandbox_seccomp.deny_syscalls``) and execs the program with the spec's scrubbed
  environment.

Without isolation the launcher forks the program's process directly (it drops to the
run's uid when one is given; the filter holds where the machine has a table). A setup step that
fails writes ``error MESSAGE`` on the status pipe and exits with ``SETUP_FAILED``. With
SPEC ``{"kill_uid": UID}`` it instead kills every process of that uid.

The launcher is three files: this one (namespaces, the jail, the program's process),
``sandbox_seccomp.py`` (system calls by name and number, the seccomp filter) and
``sandbox_watch.py`` (init's watcher). Run as a script it imports the other two from its own
directory, first thing, before the jail hides that directory. The parent imports this module
only for the constants below; none of the three may ever import the parent or anything else
from rlsys (but for each other, as rlsys.rewards modules, when the parent imports them).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import resource
import signal
import sys

if __name__ == "__main__":  # the launcher script: -I leaves its own directory off sys.path
    # appended, after the standard library, which no file of this directory may shadow (such
    # as math.py and code.py); imported here, before the jail hides this directory
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
    import sandbox_seccomp
    import sandbox_watch
else:  # imported by the parent (rlsys.rewards.sandbox) for the constants below
    from rlsys.rewards import sandbox_seccomp, sandbox_watch

WORK_MOUNT = "/tmp/work"  # the program's directory inside the jail (a tmpfs of disk_mb)
JAIL_ROOT = "/tmp"  # the host directory the jail's root tmpfs is built over
SETUP_FAILED = 125  # launcher exit status when it could not build the sandbox
_DEVICES = ("null", "zero", "full", "random", "urandom")  # /dev nodes bound into the jail
_KEYCTL_GET_KEYRING_ID, _KEYCTL_JOIN_SESSION_KEYRING, _KEYCTL_CLEAR = 0, 1, 7
_KEY_SPEC_SESSION, _KEY_SPEC_USER, _KEY_SPEC_USER_SESSION = -3, -4, -5
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
_HIDEPID = "hidepid=2"  # /proc shows a process only to who may ptrace it: not init to the program
# per machine: (seccomp audit arch, numbers by name); read through _syscall_table only
_SYSCALLS = sandbox_seccomp.SYSCALLS
_libc_call = sandbox_seccomp.libc_call  # a libc function by name; OSError unless it returns 0


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


def _build_jail(spec: dict, sized: bool) -> None:
    """In the new mount namespace: a root holding only the paths the interpreter needs
    (read-only), the program's directory (a tmpfs of ``disk_mb``), /dev's harmless nodes and a
    fresh /proc; then pivot into it, leaving the host's tree unreachable. Unless the watcher
    can size mapped files (``sized``), the jail's /dev/zero is the host's /dev/full: it reads
    as zeros too, but cannot be mapped (a shared mapping of /dev/zero is shared memory)."""
    jail = spec["jail"]
    with open(os.path.join(spec["workdir"], "prog.py"), "rb") as f:
        program = f.read()
    sources = _bind_sources(jail)
    sources_of = {} if sized else {"zero": "full"}
    devices = [
        (f"/dev/{n}", os.open(f"/dev/{sources_of.get(n, n)}", os.O_PATH), False) for n in _DEVICES
    ]
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
    if not spec["userns"]:  # root mode: the program's ids outside its user namespace
        os.chown(work, spec["ids"]["uid"][1], spec["ids"]["gid"][1])
    os.makedirs(root + "/proc", mode=0o755)
    # writable until init has written the program's id maps (_map_program_ids)
    _mount("proc", root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, _HIDEPID)
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
    number = _syscall_table(required=True)[1]["pivot_root"]
    if sandbox_seccomp.libc().syscall(number, b".", b".") != 0:
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


def _exec_program(spec: dict, handshake: tuple[int, int] | None = None, sized: bool = True) -> None:
    """The program's process: limits, identity, keyrings, no_new_privs, the seccomp filter,
    then execve. Isolated, it first enters a user namespace of its own (``handshake``: the
    pipe ends to ask init for its id maps and to wait for them); ``sized``: whether the
    watcher can size mapped files (else the filter refuses shared memory it could not)."""
    os.chdir(spec["cwd"])
    _set_limits(spec["limits"])
    uid = spec["uid"]
    if handshake is not None:
        _enter_program_userns(spec, *handshake)
    elif uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    _fresh_keyrings(run_uid=uid is not None)
    _libc_call("prctl", _PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binaries
    sandbox_seccomp.deny_syscalls(_syscall_table(required=spec["isolate"]), sized=sized)
    os.set_inheritable(spec["status_fd"], False)  # closes on exec: no message means success
    os.execve(spec["argv"][0], spec["argv"], spec["env"])


def _enter_program_userns(spec: dict, ready_w: int, go_r: int) -> None:
    """Unshare a user namespace for the program alone, have init map its ids (``ids``: the
    program's uid and gid inside, and the unprivileged ids they are outside), take them. The
    namespace owns nothing: the jail's mounts, network, PID and IPC namespaces belong to the
    namespace above it, so even its root (every capability in it) can change none of them."""
    if not spec["userns"]:  # root mode: drop root's supplementary groups while it may
        os.setgroups([])
    try:
        _libc_call("unshare", _CLONE_NEWUSER)
    except OSError as exc:
        raise OSError(
            exc.errno,
            "the jail runs the program in a user namespace of its own and this kernel refused "
            f"one ({os.strerror(exc.errno)}): allow user namespaces (sysctl user.max_user_namespaces > 0; "
            "in a container, a seccomp profile that permits unshare(CLONE_NEWUSER)), or set "
            "reward.sandbox.unsafe_no_isolation=true to run code rewards unjailed",
        ) from None
    os.write(ready_w, b"u")
    if os.read(go_r, 1) != b"g":
        raise OSError(errno.EPIPE, "init did not map the program's user namespace")
    os.close(ready_w)
    os.close(go_r)
    (uid, _), (gid, _) = spec["ids"]["uid"], spec["ids"]["gid"]
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # not 0 (but for uid_mode self as root): no capability at exec


def _map_program_ids(spec: dict, pid: int, ready_r: int, go_w: int) -> None:
    """Init's half of ``_enter_program_userns``: write the program's id maps (init holds
    CAP_SETUID and CAP_SETGID over the namespace above), then make /proc read-only (it had
    to be writable for the maps) and let the program go on."""
    if os.read(ready_r, 1) != b"u":
        return  # the program's process failed before (it reported why on the status pipe)
    maps = [("setgroups", "deny")]
    maps += [(f"{kind}_map", "{} {} 1".format(*spec["ids"][kind])) for kind in ("uid", "gid")]
    for name, text in maps:
        fd = os.open(f"/proc/{pid}/{name}", os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
    flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _mount(None, "/proc", None, flags)
    os.write(go_w, b"g")


def _syscall_table(required: bool) -> tuple[int, dict[str, int]] | None:
    """This machine's seccomp audit arch and system call numbers; None where it has no table
    and the filter is not ``required`` (unsafe mode: only the rlimits and the uid hold)."""
    machine = os.uname().machine
    table = _SYSCALLS.get(machine)
    if table is None and required:
        raise OSError(
            errno.ENOSYS,
            f"the jail's seccomp filter has no system call table for this machine ({machine}; "
            f"it knows {', '.join(_SYSCALLS)}): run code rewards (task.reward=code_tests) on "
            "such a host, or set reward.sandbox.unsafe_no_isolation=true to run them unjailed",
        )
    return table


def _keyctl(operation: int, *args: int) -> int:
    table = _syscall_table(required=False)
    if table is None:
        raise OSError(errno.ENOSYS, f"keyctl: no system call table for {os.uname().machine}")
    libc = sandbox_seccomp.libc()
    libc.syscall.restype = ctypes.c_long
    number = table[1]["keyctl"]
    value = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in (operation, *args)))
    if value < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"keyctl({operation}): {os.strerror(err)}")
    return value


def _fresh_keyrings(run_uid: bool) -> None:
    """Leave the trainer's session keyring (its possessor may read every key in it) for a new
    anonymous one that dies with the run; with a uid of the run's own (``run_uid``), empty that
    uid's user keyrings too, of what an earlier run on the uid left there."""
    try:
        _keyctl(_KEYCTL_JOIN_SESSION_KEYRING, 0)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM):
            raise
        try:  # keyrings are off here (no CONFIG_KEYS, or a seccomp filter): for all processes?
            _keyctl(_KEYCTL_GET_KEYRING_ID, _KEY_SPEC_SESSION, 0)
        except OSError:
            return
        raise
    if run_uid:
        for keyring in (_KEY_SPEC_USER, _KEY_SPEC_USER_SESSION):
            _keyctl(_KEYCTL_CLEAR, keyring)


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
    whole sandbox to its memory and CPU limits, and reports the program's wait status. It
    keeps the launcher's credentials (as root, every capability: it maps the program's ids
    and sizes mapped files through /proc/PID/map_files); the program cannot reach it (not
    dumpable, hidden from /proc, and in a namespace above the program's)."""
    _libc_call("prctl", _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    _libc_call("prctl", _PR_SET_DUMPABLE, 0, 0, 0, 0)  # the program cannot ptrace init
    # PID 1 gets only the signals it handles: with none handled, the program (the same uid
    # in a user namespace) cannot interrupt init to hide a verdict
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sized = sandbox_watch.sizes_mapped_files()
    _build_jail(spec, sized)
    (ready_r, ready_w), (go_r, go_w) = os.pipe(), os.pipe()  # close on exec
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        # dumpable again until execve: else /proc (hidepid) hides this process from init in
        # non-root mode, where init has no capability over the host's namespace
        _libc_call("prctl", _PR_SET_DUMPABLE, 1, 0, 0, 0)
        _guarded(spec["status_fd"], _exec_program, spec, (ready_w, go_r), sized)
    os.close(ready_w)
    os.close(go_r)
    _guarded(spec["status_fd"], _map_program_ids, spec, pid, ready_r, go_w)
    os.close(ready_r)
    os.close(go_w)
    status, exceeded = sandbox_watch.watch(pid, spec["limits"], WORK_MOUNT, sized)
    if exceeded:
        os.write(spec["status_fd"], f"killed {exceeded}\n".encode())
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
        _guarded(status_fd, _syscall_table, True)  # refuse at once where the filter cannot be
        _guarded(status_fd, _enter_namespaces, spec)
    pid = os.fork()
    if pid == 0:
        _guarded(status_fd, _init if spec["isolate"] else _exec_program, spec)
    os.close(status_fd)
    _exit_like(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    _launcher_main(json.loads(sys.argv[1]))
