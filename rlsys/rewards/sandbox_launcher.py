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
* init forks the program's process, then watches the whole sandbox: every ``_POLL_S`` it adds
  up the memory (anonymous and shared, then exactly by PSS when that passes the limit, plus
  memfds and SysV segments no process maps) and the CPU time of all its processes (each
  process's last seen, so children nobody waits for count too) and kills them all when a
  total passes the limit; it reports the program's wait status (and ``killed LIMIT``) on the
  status pipe;
* the program's process sets the per-process rlimits, enters a user namespace of its own
  (one that owns none of the jail's namespaces, so that even its root can change no mount,
  network or process of the jail) where init maps its ids (``ids``: as root, the run's
  unprivileged uid), joins a fresh session keyring, sets no_new_privs and a seccomp filter
  (``_deny_syscalls``) and execs the program with the spec's scrubbed environment.

Without isolation the launcher forks the program's process directly (it drops to the
run's uid when one is given; the filter holds where the machine has a table). A setup step that
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
import time

WORK_MOUNT = "/tmp/work"  # the program's directory inside the jail (a tmpfs of disk_mb)
JAIL_ROOT = "/tmp"  # the host directory the jail's root tmpfs is built over
SETUP_FAILED = 125  # launcher exit status when it could not build the sandbox
_DEVICES = ("null", "zero", "full", "random", "urandom")  # /dev nodes bound into the jail
_POLL_S = 0.01  # how often init adds up the sandbox's memory and CPU time
_FILES_EVERY = 10  # polls between counts of memory held in files (memfd, SysV shm)
_UNKNOWN_PSS = 1 << 62  # smaps_rollup unreadable: trust the resident upper bound
_TICKS = os.sysconf("SC_CLK_TCK")
_PID_MAX = 1 << 22  # pids wrap below this (the kernel's largest pid_max)
# System call numbers the launcher calls (pivot_root, keyctl) or its seccomp filter denies,
# per machine, with the machine's seccomp audit arch. aarch64 and riscv64 share the kernel's
# generic table (asm-generic/unistd.h); any other machine has no filter table, and isolated
# runs refuse there (``_syscall_table``).
_GENERIC_SYSCALLS = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "add_key": 217,
    "request_key": 218,
    "keyctl": 219,
    "bpf": 280,
    "perf_event_open": 241,
    "userfaultfd": 282,
    "mount": 40,
    "umount2": 39,
    "pivot_root": 41,
    "chroot": 51,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "open_tree_attr": 467,
    "setns": 268,
    "unshare": 97,
    "clone": 220,
    "clone3": 435,
    "ptrace": 117,
    "process_vm_readv": 270,
    "process_vm_writev": 271,
    "pidfd_getfd": 438,
    "open_by_handle_at": 265,
    "socket": 198,
    "mknodat": 33,
    "kexec_load": 104,
    "kexec_file_load": 294,
    "init_module": 105,
    "finit_module": 273,
    "delete_module": 106,
    "reboot": 142,
    "swapon": 224,
    "swapoff": 225,
    "acct": 89,
    "syslog": 116,
}
_SYSCALLS = {
    "x86_64": (
        0xC000003E,
        {
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "open_tree_attr": 467,
            "setns": 308,
            "unshare": 272,
            "clone": 56,
            "clone3": 435,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "pidfd_getfd": 438,
            "open_by_handle_at": 304,
            "socket": 41,
            "mknod": 133,
            "mknodat": 259,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "acct": 163,
            "syslog": 103,
            "iopl": 172,
            "ioperm": 173,
        },
    ),
    "aarch64": (0xC00000B7, _GENERIC_SYSCALLS),
    "riscv64": (0xC00000F3, _GENERIC_SYSCALLS),
}
# The seccomp filter's deny-list (the program's, installed last before execve):
_ENOSYS_CALLS = ("add_key", "request_key", "keyctl", "clone3")  # clone3: glibc falls back
_EPERM_CALLS = (  # kernel interfaces a program has no use for, and the jail's own tools
    *("io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "perf_event_open"),
    *("userfaultfd", "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount"),
    *("fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "open_tree_attr", "setns"),
    *("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "open_by_handle_at"),
    *("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"),
    *("reboot", "swapon", "swapoff", "acct", "syslog", "iopl", "ioperm"),
)
_DENIED_FAMILIES = (16, 40)  # socket(): AF_NETLINK, AF_VSOCK (it ignores network namespaces)
# clone/unshare flags: every new namespace (a user namespace's root may make the others);
# CLONE_NEWTIME (0x80) only for unshare (in clone's flags those bits are the exit signal)
_CLONE_NEW_ANY = 0x7E020000
_CLONE_NEWTIME = 0x80
_S_IFMT, _S_IFCHR, _S_IFBLK = 0o170000, 0o020000, 0o060000  # mknod: no device nodes
_X32_SYSCALL_BIT = 0x40000000  # x86_64's x32 ABI: the same arch, numbers with this bit set
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
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
_SECCOMP_MODE_FILTER, _SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 2, 0x7FFF0000, 0x00050000
_BPF_LD_ABS_W, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_BPF_AND_K = 0x54
_HIDEPID = "hidepid=2"  # /proc shows a process only to who may ptrace it: not init to the program


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


def _exec_program(spec: dict, handshake: tuple[int, int] | None = None) -> None:
    """The program's process: limits, identity, keyrings, no_new_privs, the seccomp filter,
    then execve. Isolated, it first enters a user namespace of its own (``handshake``: the
    pipe ends to ask init for its id maps and to wait for them)."""
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
    _deny_syscalls(required=spec["isolate"])
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
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    _libc.syscall.restype = ctypes.c_long
    number = table[1]["keyctl"]
    value = _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in (operation, *args)))
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


def _filter_program(arch: int, numbers: dict[str, int]) -> list[tuple[int, int, int, int]]:
    """The classic BPF program of ``_deny_syscalls``: (code, jump if true, jump if false, k)."""
    low = 4 if sys.byteorder == "big" else 0  # the low 32 bits of a 64-bit argument

    def arg(index: int) -> tuple:
        return (_BPF_LD_ABS_W, 0, 0, 16 + 8 * index + low)  # seccomp_data.args[index]

    # jumps name a label; the labels' returns and argument checks follow the number checks
    code: list[tuple] = [
        (_BPF_LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 0, "enosys", arch),
        (_BPF_LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
    ]
    if arch == _SYSCALLS["x86_64"][0]:
        code.append((_BPF_JGE_K, "enosys", 0, _X32_SYSCALL_BIT))
    branches = {"socket": "socket", "clone": "clone", "unshare": "unshare"}
    branches.update({"mknod": "mknod", "mknodat": "mknodat"})
    for names, label in ((_ENOSYS_CALLS, "enosys"), (_EPERM_CALLS, "eperm")):
        code += [(_BPF_JEQ_K, label, 0, numbers[n]) for n in names if n in numbers]
    code += [(_BPF_JEQ_K, label, 0, numbers[n]) for n, label in branches.items() if n in numbers]
    code.append((_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    labels = {}

    def block(label: str, *insns: tuple) -> None:
        labels[label] = len(code)
        code.extend(insns)

    allow = (_BPF_RET_K, 0, 0, _SECCOMP_RET_ALLOW)
    block(
        "socket",
        arg(0),
        *((_BPF_JEQ_K, "eafnosupport", 0, family) for family in _DENIED_FAMILIES),
        allow,
    )
    block("clone", arg(0), (_BPF_JSET_K, "eperm", 0, _CLONE_NEW_ANY), allow)  # clone(flags, ...)
    block("unshare", arg(0), (_BPF_JSET_K, "eperm", 0, _CLONE_NEW_ANY | _CLONE_NEWTIME), allow)
    for label, mode in (("mknod", 1), ("mknodat", 2)):  # (path, mode, dev), (dirfd, path, ...)
        block(
            label,
            arg(mode),
            (_BPF_AND_K, 0, 0, _S_IFMT),
            (_BPF_JEQ_K, "eperm", 0, _S_IFCHR),
            (_BPF_JEQ_K, "eperm", 0, _S_IFBLK),
            allow,
        )
    for label, err in (
        ("enosys", errno.ENOSYS),
        ("eperm", errno.EPERM),
        ("eafnosupport", errno.EAFNOSUPPORT),
    ):
        block(label, (_BPF_RET_K, 0, 0, _SECCOMP_RET_ERRNO | err))
    program = []
    for index, (op, jt, jf, k) in enumerate(code):
        jt, jf = (labels[j] - index - 1 if isinstance(j, str) else j for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, (index, jt, jf)
        program.append((op, jt, jf, k))
    return program


def _deny_syscalls(required: bool) -> None:
    """The program's seccomp filter (after no_new_privs, right before execve, so that it holds
    for the program and all it starts, and never for init). It fails with

    * ENOSYS: add_key, request_key and keyctl (the trainer's keyrings), clone3 (its flags are
      out of a filter's reach; glibc then falls back to clone), and every system call of
      another ABI (i386, x32) that could reach the rest by other numbers;
    * EPERM: io_uring, bpf, perf_event_open, userfaultfd, the mount family (mount, umount2,
      pivot_root, chroot, the new mount API), setns, ptrace and process_vm_readv/writev and
      pidfd_getfd, open_by_handle_at, the kernel's administration (modules, kexec, reboot,
      swap, acct, syslog, x86 I/O ports), clone and unshare with any new namespace flag, and
      mknod of a character or block device (a FIFO is fine);
    * EAFNOSUPPORT: socket() of AF_NETLINK and AF_VSOCK.

    ``required`` (isolated runs): a machine without a table (``_SYSCALLS``) refuses the run;
    otherwise (unsafe mode) it runs unfiltered."""
    table = _syscall_table(required)
    if table is None:
        return
    program = _filter_program(*table)

    class SockFilter(ctypes.Structure):
        _fields_ = (
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint32),
        )

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter)))

    filters = (SockFilter * len(program))(*(SockFilter(*insn) for insn in program))
    fprog = SockFprog(len(program), filters)
    try:
        _libc_call("prctl", _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        raise OSError(
            exc.errno,
            "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER), which the jail needs: "
            "run code rewards on a kernel built with them, or set "
            "reward.sandbox.unsafe_no_isolation=true to run them unjailed",
        ) from None


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
    _build_jail(spec)
    (ready_r, ready_w), (go_r, go_w) = os.pipe(), os.pipe()  # close on exec
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        # dumpable again until execve: else /proc (hidepid) hides this process from init in
        # non-root mode, where init has no capability over the host's namespace
        _libc_call("prctl", _PR_SET_DUMPABLE, 1, 0, 0, 0)
        _guarded(spec["status_fd"], _exec_program, spec, (ready_w, go_r))
    os.close(ready_w)
    os.close(go_r)
    _guarded(spec["status_fd"], _map_program_ids, spec, pid, ready_r, go_w)
    os.close(ready_r)
    os.close(go_w)
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
    clock = _CpuClock()
    files = _Files()
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
        # ascending: a parent (older, lower pid) is read before the children it may reap
        pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit() and name != "1")
        procs = _read_processes(pids)
        if poll % _FILES_EVERY == 0:
            files.count(pids)
        anon = sum(p.anon for p in procs.values())
        shmem = sum(p.shmem for p in procs.values())
        exceeded = None
        if anon + files.beside(shmem) > memory_limit:
            files.count(pids)  # confirm with exact figures before killing
            if _proportional(pids, files.sized) + files.held > memory_limit:
                exceeded = "memory"
        # confirmed by a second read: a child read just before its parent reaped it counts
        # twice in one read
        if (
            not exceeded
            and clock.seconds(procs) > limits["cpu_s"]
            and clock.seconds(_read_processes(pids)) > limits["cpu_s"]
        ):
            exceeded = "cpu_time"
        if exceeded:
            _kill_all()
            return os.waitpid(pid, 0)[1], exceeded


class _Proc:
    """One process as /proc shows it at a poll (CPU in seconds, memory in bytes)."""

    __slots__ = ("start", "own", "kids", "threads", "anon", "shmem")

    def __init__(self, stat: bytes, status: bytes) -> None:
        fields = stat.rpartition(b")")[2].split()
        self.start = fields[19]  # with the pid, names the process (pids are reused)
        self.own = (int(fields[11]) + int(fields[12])) / _TICKS  # utime + stime (all threads)
        self.kids = (int(fields[13]) + int(fields[14])) / _TICKS  # children it waited for
        self.threads = max(1, int(fields[17]))
        self.anon = self.shmem = 0
        for line in status.split(b"\n"):
            if line.startswith(b"RssAnon:"):
                self.anon = int(line.split()[1]) * 1024
            elif line.startswith(b"RssShmem:"):
                self.shmem = int(line.split()[1]) * 1024


def _read_processes(pids: list[int]) -> dict[int, _Proc]:
    """Each of ``pids`` still alive (zombies too: they hold their final CPU times)."""
    procs = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{pid}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue  # it was reaped meanwhile
        procs[pid] = _Proc(stat, status)
    return procs


class _CpuClock:
    """CPU seconds the whole sandbox has used: the larger of two lower bounds, plus a charge
    for what neither holds.

    * *live*: every live process's own time and that of the children it waited for
      (``cutime``), plus what init reaped (orphans, with their own waited-for children). A
      child that lives between two polls is never seen, but its time reaches its reaper.
    * *seen*: every process's own time when last seen, kept after it is gone: a child whose
      parent ignores SIGCHLD is reaped by no one, so no ``cutime`` holds its time.
    * *ended*: a process reaped by no one takes with it the time it ran since it was last
      seen (all of it if it started after the last poll). So each process that ended since
      the last poll, and each task (process or thread) that started since and is not alive
      (the namespace's pid counter says how many started), is charged the whole interval,
      at most every CPU of the sandbox, less the time reaped in the interval: an upper
      bound, so a program that churns through short tasks is charged more than it used."""

    def __init__(self) -> None:
        self.seen: dict[tuple[int, bytes], tuple[float, int]] = {}  # -> own time, threads
        self.seen_total = 0.0
        self.alive: set[tuple[int, bytes]] = set()  # at the last read
        self.ended = 0.0
        self.cpus = len(os.sched_getaffinity(0))
        self.last_pid, self.time, self.reaped = _last_pid(), time.monotonic(), 0.0

    def seconds(self, procs: dict[int, _Proc]) -> float:
        now, last_pid = time.monotonic(), _last_pid()
        started = (last_pid - self.last_pid) % _PID_MAX  # tasks started since the last read
        reaped = 0.0
        alive = set()
        for pid, proc in procs.items():
            key = (pid, proc.start)
            alive.add(key)
            own, threads = self.seen.get(key, (0.0, 0))
            started -= max(0, proc.threads - threads)  # alive, so seen now
            self.seen_total += proc.own - own
            self.seen[key] = (proc.own, proc.threads)
            reaped += proc.kids
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        reaped += usage.ru_utime + usage.ru_stime
        live = sum(p.own for p in procs.values()) + reaped
        ended = len(self.alive - alive) + max(0, started)
        if ended:
            window = min(ended, self.cpus) * (now - self.time)
            self.ended += max(0.0, window - (reaped - self.reaped))
        self.alive, self.last_pid, self.time, self.reaped = alive, last_pid, now, reaped
        return max(live, self.seen_total) + self.ended


def _last_pid() -> int:
    """The last pid the sandbox's PID namespace gave out (to a process or a thread)."""
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


class _Files:
    """Memory the sandbox holds in files, each file once by its allocated blocks: shared memory
    files (memfds, shared anonymous mappings) its processes keep open or mapped, SysV segments
    of its IPC namespace, and the files of its work directory (a tmpfs).

    ``sized``: the files a process only maps can be sized through /proc/PID/map_files (it
    needs CAP_SYS_ADMIN in the host's user namespace: root mode). Without it (non-root mode)
    the mapped part is counted from the processes' shared resident memory instead, and a
    file held only by a mapping counts only as far as it is mapped and resident."""

    def __init__(self) -> None:
        self.held = 0  # bytes when last counted
        try:
            fd = os.memfd_create("rlsys-probe")  # shared memory files live on its device
        except OSError:  # no memfds here: nor for the program
            self.device, self.maps_device = -1, b""
        else:
            self.device = os.fstat(fd).st_dev
            os.close(fd)
            self.maps_device = b"%02x:%02x" % (os.major(self.device), os.minor(self.device))
        try:
            os.stat(f"/proc/self/map_files/{_first_mapping()}")
            self.sized = True
        except OSError:
            self.sized = False

    def beside(self, shmem: int) -> int:
        """Held in files, given ``shmem`` resident bytes of shared memory mapped now: a cheap
        upper bound between exact counts (the last count may be up to _FILES_EVERY old)."""
        return max(shmem, self.held) if self.sized else shmem + self.held

    def count(self, pids: list[int]) -> None:
        """Count now (costlier: every descriptor, every mapping on the shared memory device)."""
        files: dict[tuple[bool, int], int] = {}  # (SysV?, inode) -> bytes
        for pid in pids:
            self._descriptors(pid, files)
            if self.sized:
                self._mappings(pid, files)
        work = os.statvfs(WORK_MOUNT)
        self.held = (
            sum(files.values())
            + _sysv_bytes(attached=self.sized)
            + (work.f_blocks - work.f_bfree) * work.f_frsize
        )

    def _descriptors(self, pid: int, files: dict) -> None:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if st.st_dev == self.device:
                files[(False, st.st_ino)] = st.st_blocks * 512

    def _mappings(self, pid: int, files: dict) -> None:
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = f.read()
        except OSError:
            return
        device = b" %s " % self.maps_device
        if device not in maps:
            return  # most processes map no shared memory: skip the parsing
        for line in maps.splitlines():
            if device not in line:
                continue
            fields = line.split(maxsplit=5)  # range perms offset device inode path
            if len(fields) < 6 or fields[3] != self.maps_device or fields[5].startswith(b"/SYSV"):
                continue  # not shared memory; SysV segments are counted by _sysv_bytes
            key = (False, int(fields[4]))
            if key not in files:
                try:
                    st = os.stat(f"/proc/{pid}/map_files/{fields[0].decode()}")
                except OSError:
                    continue  # unmapped meanwhile
                files[key] = st.st_blocks * 512


def _first_mapping() -> str:
    with open("/proc/self/maps") as f:
        return f.readline().split()[0]


def _sysv_bytes(attached: bool) -> int:
    """Bytes allocated to the SysV segments of the sandbox's IPC namespace (``attached``: also
    those some process maps; else only the others, the mapped ones being counted as resident
    memory)."""
    try:
        with open("/proc/sysvipc/shm", "rb") as f:
            header, *rows = f.read().splitlines()
    except (OSError, ValueError):
        return 0
    names = header.split()
    nattch, rss, swap = (names.index(n) for n in (b"nattch", b"rss", b"swap"))
    total = 0
    for row in rows:
        columns = row.split()
        if attached or columns[nattch] == b"0":
            total += int(columns[rss]) + int(columns[swap])
    return total


def _proportional(pids: list[int], sized: bool) -> int:
    """Anonymous memory of ``pids`` with each page shared after a fork divided among its
    sharers (PSS), plus shared memory so divided unless ``sized`` (then it is counted in
    files): exact, but costly, so read only when the cheap upper bound passes the limit."""
    wanted = (b"Pss_Anon:",) if sized else (b"Pss_Anon:", b"Pss_Shmem:")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                rollup = f.read()
        except OSError:
            continue
        for line in rollup.split(b"\n"):
            if line.startswith(wanted):
                total += int(line.split()[1]) * 1024
    return total or _UNKNOWN_PSS


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
        _guarded(status_fd, _syscall_table, True)  # refuse at once where the filter cannot be
        _guarded(status_fd, _enter_namespaces, spec)
    pid = os.fork()
    if pid == 0:
        _guarded(status_fd, _init if spec["isolate"] else _exec_program, spec)
    os.close(status_fd)
    _exit_like(os.waitpid(pid, 0)[1])


if __name__ == "__main__":
    _launcher_main(json.loads(sys.argv[1]))
