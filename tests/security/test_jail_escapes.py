"""The jail against a program that is, or regains, root (issue 47, "the jail against root"):
each route out of the jail that root, or an unprivileged program, had is tried from inside
the sandbox and must fail.

Each test runs a program that tries one route and prints ``OPEN <evidence>`` for each way it
got through; the test fails naming the route and the identity it ran as:

* ``program``: a sandboxed program as every run starts one;
* ``root`` (root mode only): the most privileged identity the sandbox gives a program, what a
  program that regained root would hold. It is the run without a uid of its own
  (``uid_mode="self"``): before the jail had a user namespace this was the host's root with
  every capability; now it is the root of the program's own user namespace (every
  capability there, none over the jail's mounts, network or processes), mapped to nobody.

A program that is not root first tries to become root of a user namespace of its own (the
route an unprivileged program has, itself closed by ``test_new_user_namespaces``). No
program changes anything on the host: writes go to the jail's own mounts, and the host's
``core_pattern`` is written with its own value, checked unchanged after.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pytest

from rlsys.config.reward import SandboxConfig
from rlsys.rewards import sandbox
from rlsys.rewards.sandbox import run_sandboxed, sandbox_support

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux"),
    pytest.mark.usefixtures("isolated"),
]

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0
IDENTITIES = ["program", "root"] if ROOT else ["program"]  # non-root mode: only the program
CFG = SandboxConfig(wall_s=20.0, cpu_s=10.0)
# System call numbers the routes need that glibc has no wrapper for
_NUMBERS = {
    "x86_64": {
        "clone": 56,
        "clone3": 435,
        "io_uring_setup": 425,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
    },
    "aarch64": {
        "clone": 220,
        "clone3": 435,
        "io_uring_setup": 425,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
    },
}.get(os.uname().machine)
numbers = pytest.mark.skipif(_NUMBERS is None, reason="system call numbers for x86_64 and aarch64")

_PRELUDE = f"""
import ctypes, os, socket, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
NR = {_NUMBERS!r}

def call(name, *args):
    value = libc.syscall(L(NR[name]), *args)
    return value, os.strerror(ctypes.get_errno())

def opened(evidence):
    print("OPEN", evidence, flush=True)

def closed(why):
    print("closed:", why, flush=True)

def regain_root():
    # what a program that is not root tries first: root of a user namespace of its own
    if os.geteuid() == 0:
        return
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
        closed("no user namespace to be root in: " + os.strerror(ctypes.get_errno()))
        return
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {{uid}} 1"),
                       ("gid_map", f"0 {{gid}} 1")):
        with open(f"/proc/self/{{name}}", "w") as f:
            f.write(text)
    closed("(root of a new user namespace)")
"""


def _run(program: str, identity: str, stdin: str = "") -> sandbox.SandboxResult:
    code = _PRELUDE + program + "\nprint('checked', flush=True)\n"
    if identity == "root":
        support = dataclasses.replace(sandbox_support(), uid_mode="self")
        return sandbox._execute(code, stdin, CFG, support)
    return run_sandboxed(code, stdin, CFG)


def _assert_closed(route: str, identity: str, program: str, stdin: str = "") -> None:
    result = _run(program, identity, stdin)
    evidence = [line for line in result.stdout.splitlines() if line.startswith("OPEN")]
    assert not evidence, f"{route} is open to the {identity}: {evidence}"
    assert result.ok and result.stdout.rstrip().endswith("checked"), result


# ---- routes for a program that is root ------------------------------------------------

_REMOUNT = """
regain_root()
MS_REMOUNT, MS_BIND = 32, 4096
KEEP = ((2, 2), (4, 4), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21))  # ST_* -> MS_*
targets = ["/", os.path.dirname(os.__file__)]
targets += [p for p in ("/usr/lib", "/lib") if os.path.isdir(p) and not os.path.islink(p)]
for target in targets:
    st_flags = os.statvfs(target).f_flag
    flags = MS_REMOUNT | MS_BIND | sum(ms for st, ms in KEEP if st_flags & st)
    if libc.mount(None, target.encode(), None, L(flags), None) != 0:
        closed(f"remount {target}: " + os.strerror(ctypes.get_errno()))
    elif not os.statvfs(target).f_flag & os.ST_RDONLY:
        opened(f"remounted the read-only bind {target} read-write")
"""


@pytest.mark.parametrize("identity", IDENTITIES)
def test_read_only_binds_stay_read_only(identity):
    """Root remounted the jail's read-only binds of host directories (the interpreter, its
    standard library, the system libraries) read-write."""
    _assert_closed("remounting a read-only bind read-write", identity, _REMOUNT)


_BY_HANDLE = """
regain_root()
class Handle(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint), ("type", ctypes.c_int), ("bytes", ctypes.c_ubyte * 128)]
handle, mount_id = Handle(128, 0), ctypes.c_int()
AT_EMPTY_PATH, FILEID_INO32_GEN = 0x1000, 1
if libc.name_to_handle_at(0, b"", ctypes.byref(handle), ctypes.byref(mount_id), AT_EMPTY_PATH):
    closed("name_to_handle_at(stdin): " + os.strerror(ctypes.get_errno()))
else:
    fd = libc.open_by_handle_at(0, ctypes.byref(handle), os.O_RDONLY)
    if fd >= 0:
        opened(f"reopened stdin, a host file, by its handle: {os.read(fd, 64)!r}")
    else:
        closed("open_by_handle_at(stdin's handle): " + os.strerror(ctypes.get_errno()))
    if handle.type == FILEID_INO32_GEN:  # ext2/3/4: inode 2, any generation, is the root
        root = Handle(8, FILEID_INO32_GEN)
        root.bytes[0] = 2
        fd = libc.open_by_handle_at(0, ctypes.byref(root), os.O_RDONLY | os.O_DIRECTORY)
        if fd >= 0:
            opened(f"the root of the host's file system by handle: {sorted(os.listdir(fd))[:6]}")
        else:
            closed("open_by_handle_at(inode 2): " + os.strerror(ctypes.get_errno()))
"""


@pytest.mark.parametrize("identity", IDENTITIES)
def test_host_files_cannot_be_opened_by_handle(identity):
    """Root (CAP_DAC_READ_SEARCH) opened any file of the host's file system by handle,
    through stdin (a host file): its root directory is inode 2 on ext4."""
    _assert_closed("opening host files by handle", identity, _BY_HANDLE, stdin="host stdin")


_MKNOD = """
regain_root()
major, minor = {device}
for where in ("the work directory", "a fresh tmpfs"):
    path = "disk"
    if where == "a fresh tmpfs":
        os.mkdir("mnt")
        if libc.mount(b"tmpfs", b"mnt", b"tmpfs", L(0), b"size=1m") != 0:
            closed("mount a tmpfs: " + os.strerror(ctypes.get_errno()))
            break
        path = "mnt/disk"
    try:
        os.mknod(path, stat.S_IFBLK | 0o600, os.makedev(major, minor))
    except OSError as exc:
        closed(f"mknod in {{where}}: {{exc.strerror}}")
        continue
    if os.statvfs(os.path.dirname(path) or ".").f_flag & 4:  # ST_NODEV
        closed(f"a node made in {{where}}, a mount that ignores device nodes (nodev)")
        continue
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:  # e.g. EPERM from a container's device cgroup: not the jail's doing
        opened(f"a node for the disk {{major}}:{{minor}} in {{where}}, a mount that honours "
               f"device nodes (open: {{exc.strerror}})")
    else:
        data = os.pread(fd, 2048, 0)
        opened(f"read {{len(data)}} bytes of the disk {{major}}:{{minor}} through a node in {{where}}")
    break
"""


@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_device_node_for_the_disk(identity):
    """Root created a block device node for the host's disk on a tmpfs of its own (the work
    directory is nodev) and read the disk through it (where no device cgroup stops it)."""
    device = os.stat(REPO).st_dev
    if os.major(device) == 0:  # a virtual file system (overlay, tmpfs): any block device
        device = os.makedev(7, 0)
    program = _MKNOD.format(device=(os.major(device), os.minor(device)))
    _assert_closed("a device node for the disk", identity, program)


_CORE_PATTERN = """
regain_root()
path = "/proc/sys/kernel/core_pattern"
with open(path, "rb") as f:
    value = f.read()
try:
    fd = os.open(path, os.O_WRONLY)
except OSError as exc:
    closed(f"open {path} for writing: {exc.strerror}")
else:
    try:  # its own value back: the host's stays as it was
        os.write(fd, value)
        opened(f"wrote the host's {path} ({value.strip()!r})")
    except OSError as exc:
        closed(f"write {path}: {exc.strerror}")
if not os.statvfs("/proc").f_flag & os.ST_RDONLY:
    opened("/proc is mounted read-write")
for entry in ("1", "1/cmdline", "1/environ"):
    if os.path.exists(f"/proc/{entry}"):
        opened(f"init's /proc/{entry} is visible to the program")
"""


@pytest.mark.parametrize("identity", IDENTITIES)
def test_proc_is_read_only_and_core_pattern_unwritable(identity):
    """Root wrote /proc/sys/kernel/core_pattern (the host's: a piped pattern runs a command
    as the host's root at the next crash); /proc was read-write and showed init."""
    with open("/proc/sys/kernel/core_pattern", "rb") as f:
        before = f.read()
    _assert_closed("writing core_pattern through /proc", identity, _CORE_PATTERN)
    with open("/proc/sys/kernel/core_pattern", "rb") as f:
        assert f.read() == before


# ---- routes for any program -------------------------------------------------------------

_NEW_USER_NAMESPACE = """
CLONE_NEWUSER, SIGCHLD = 0x10000000, 17
pid, error = call("clone", L(CLONE_NEWUSER | SIGCHLD), L(0), L(0), L(0), L(0))
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
    opened("clone(CLONE_NEWUSER)")
else:
    closed("clone: " + error)
args = (ctypes.c_uint64 * 8)(CLONE_NEWUSER, 0, 0, 0, SIGCHLD, 0, 0, 0)  # struct clone_args
pid, error = call("clone3", ctypes.byref(args), L(ctypes.sizeof(args)))
if pid == 0:
    os._exit(0)
if pid > 0:
    os.waitpid(pid, 0)
    opened("clone3(CLONE_NEWUSER)")
else:
    closed("clone3: " + error)
if libc.unshare(CLONE_NEWUSER) == 0:
    opened("unshare(CLONE_NEWUSER)")
else:
    closed("unshare: " + os.strerror(ctypes.get_errno()))
"""


@numbers
@pytest.mark.parametrize("identity", IDENTITIES)
def test_new_user_namespaces(identity):
    """An unprivileged program made a user namespace of its own, to be root there (and reach
    the kernel code that needs capabilities in one)."""
    _assert_closed("a new user namespace", identity, _NEW_USER_NAMESPACE)


_IO_URING = """
params = ctypes.create_string_buffer(120)  # struct io_uring_params
fd, error = call("io_uring_setup", L(4), params)
if fd >= 0:
    opened("io_uring_setup")
else:
    closed("io_uring_setup: " + error)
"""


@numbers
@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_io_uring(identity):
    """io_uring: a large kernel interface (and one seccomp filters cannot see into)."""
    _assert_closed("io_uring", identity, _IO_URING)


_SOCKET = """
family, kind, protocol = {family}
try:
    socket.socket(family, kind, protocol)
except OSError as exc:
    closed(f"socket: {{exc.strerror}}")
else:
    opened(f"a socket of family {{family}}")
"""


@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_vsock_socket(identity):
    """AF_VSOCK ignores network namespaces: from a VM's guest it reaches the host (CID 2)."""
    program = _SOCKET.format(family=(40, 1, 0))  # AF_VSOCK, SOCK_STREAM
    _assert_closed("an AF_VSOCK socket", identity, program)


@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_netlink_socket(identity):
    """AF_NETLINK: the kernel's configuration interfaces (routing, netfilter, audit...)."""
    program = _SOCKET.format(family=(16, 3, 0))  # AF_NETLINK, SOCK_RAW, NETLINK_ROUTE
    _assert_closed("an AF_NETLINK socket", identity, program)


_BPF = """
attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)  # BPF_MAP_CREATE: an array, 1 entry of 4 bytes
fd, error = call("bpf", L(0), attr, L(ctypes.sizeof(attr)))
if fd >= 0:
    opened("bpf(BPF_MAP_CREATE)")
else:
    closed("bpf: " + error)
"""


@numbers
@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_bpf(identity):
    """bpf(): maps and programs run in the kernel."""
    _assert_closed("bpf", identity, _BPF)


_PERF = """
attr = (ctypes.c_uint64 * 8)()  # struct perf_event_attr, its first 64 bytes
attr[0] = 1 | (64 << 32)  # PERF_TYPE_SOFTWARE, size 64; config 0: PERF_COUNT_SW_CPU_CLOCK
attr[5] = 1 | 32 | 64  # disabled, exclude_kernel, exclude_hv
fd, error = call("perf_event_open", attr, L(0), L(-1), L(-1), L(8))  # self, any CPU, CLOEXEC
if fd >= 0:
    opened("perf_event_open")
else:
    closed("perf_event_open: " + error)
"""


@numbers
@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_perf_events(identity):
    """perf_event_open: performance counters (side channels, a frequent kernel bug site)."""
    _assert_closed("perf_event_open", identity, _PERF)


_USERFAULTFD = """
for flags in (0o2000000 | 1, 0o2000000):  # O_CLOEXEC | UFFD_USER_MODE_ONLY, O_CLOEXEC
    fd, error = call("userfaultfd", L(flags))
    if fd >= 0:
        opened(f"userfaultfd({flags:#o})")
        break
    closed("userfaultfd: " + error)
"""


@numbers
@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_userfaultfd(identity):
    """userfaultfd: stalls the kernel mid-copy at will, the usual tool to win kernel races."""
    _assert_closed("userfaultfd", identity, _USERFAULTFD)


_PTRACE = """
import signal, time
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
libc.ptrace.restype = ctypes.c_long
PTRACE_SEIZE = 0x4206
if libc.ptrace(L(PTRACE_SEIZE), L(child), None, None) == 0:
    opened("ptrace(PTRACE_SEIZE) of its own child")
else:
    closed("ptrace: " + os.strerror(ctypes.get_errno()))
os.kill(child, signal.SIGKILL)
os.waitpid(child, 0)
"""


@pytest.mark.parametrize("identity", IDENTITIES)
def test_no_ptrace(identity):
    """ptrace: reads and writes other processes' memory and registers (and system calls)."""
    _assert_closed("ptrace", identity, _PTRACE)


def test_python_still_works_in_the_jail():
    """What the filter must leave: threads, fork, subprocess, multiprocessing, sockets of
    the allowed families, mkfifo, and a program that runs as root of nothing."""
    program = """
import multiprocessing, os, socket, subprocess, sys, threading
out = []
t = threading.Thread(target=lambda: out.append("thread"))
t.start(); t.join()
pid = os.fork()
if pid == 0:
    os._exit(7)
out.append(f"fork {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}")
out.append(subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                          text=True).stdout.strip())
ctx = multiprocessing.get_context("fork")
parent_end, child_end = ctx.Pipe()
worker = ctx.Process(target=lambda end: end.send(sum(map(abs, [-1, -2]))), args=(child_end,))
worker.start(); out.append(parent_end.recv()); worker.join()
a, b = socket.socketpair()
a.send(b"unix"); out.append(b.recv(4).decode())
socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
os.mkfifo("fifo"); out.append(os.path.exists("fifo"))
print(out)
"""
    result = run_sandboxed(program, "", SandboxConfig(wall_s=30.0, cpu_s=20.0))
    assert result.ok, result
    assert result.stdout.strip() == "['thread', 'fork 7', '42', 3, 'unix', True]", result


def test_a_machine_without_a_filter_table_refuses_naming_the_fix(monkeypatch):
    """Isolated runs need the seccomp filter: on a machine it has no system call table for,
    the run is refused with a message that names the setting and the fix (unsafe mode runs
    unfiltered)."""
    from rlsys.rewards import sandbox_launcher

    monkeypatch.setattr(sandbox_launcher, "_SYSCALLS", {})
    with pytest.raises(OSError, match=r"reward\.sandbox\.unsafe_no_isolation=true"):
        sandbox_launcher._syscall_table(required=True)
    assert sandbox_launcher._syscall_table(required=False) is None
