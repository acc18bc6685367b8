"""What a sandboxed program can take from its host (issue 47, items 1, 2, 7 and 8): memory held
in files and mappings counts toward ``memory_mb``, stdout and stderr hold no host disk, the
trainer's keyrings are out of reach, and CPU time of children that live between two of the
watcher's polls counts toward ``cpu_s``."""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
import uuid

import pytest

from rlsys.config.reward import SandboxConfig
from rlsys.rewards import sandbox, sandbox_watch
from rlsys.rewards.sandbox import run_sandboxed

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the sandbox needs Linux"),
    pytest.mark.usefixtures("isolated"),
]

ROOT = os.geteuid() == 0
_LIBC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
libc.shmat.restype = ctypes.c_void_p
KEEP_SIZE, RW, SHARED, ANONYMOUS = 1, 3, 1, 0x20

def mapped(area):
    assert area not in (None, ctypes.c_void_p(-1).value), "refused: " + os.strerror(ctypes.get_errno())
    return area

def segment(size):
    shmid = libc.shmget(0, size, 0o1600)
    assert shmid >= 0, "refused: " + os.strerror(ctypes.get_errno())
    return shmid
"""

# ---- item 1: memory held in files ---------------------------------------------------

# memfds grown past their size (fallocate KEEP_SIZE skips RLIMIT_FSIZE), one page of each
# mapped, the descriptor closed: only the mapping holds each 8 MiB, and it shows 4 KiB resident
_MEMFDS_MAPPED = (
    _LIBC
    + """
for i in range(128):
    fd = os.memfd_create("x")
    os.ftruncate(fd, 4096)
    assert libc.fallocate(fd, KEEP_SIZE, 0, 8 * 2**20 - 4096) == 0, ctypes.get_errno()
    page = mapped(libc.mmap(None, 4096, RW, SHARED, fd, 0))
    ctypes.memset(page, 1, 1)
    os.close(fd)
"""
)
# shared memory touched, then all of it unmapped but one page: the rest stays. Made by a
# shared anonymous mapping, a shared mapping of /dev/zero, or a SysV segment
_SHARED_UNMAPPED = """
for i in range(16):
    area = mapped({make})
    ctypes.memset(area, 1, 64 * 2**20)
    libc.munmap(area + 4096, 64 * 2**20 - 4096)
"""
_SHARED_ANONYMOUS = _LIBC + _SHARED_UNMAPPED.format(
    make="libc.mmap(None, 64 * 2**20, RW, SHARED | ANONYMOUS, -1, 0)"
)
_DEV_ZERO = (
    _LIBC
    + "zero = os.open('/dev/zero', os.O_RDWR)\n"
    + _SHARED_UNMAPPED.format(make="libc.mmap(None, 64 * 2**20, RW, SHARED, zero, 0)")
)
_SYSV = _LIBC + _SHARED_UNMAPPED.format(make="libc.shmat(segment(64 * 2**20), None, 0)")
# files in its own directory (a tmpfs: memory) besides a heap
_WORK_FILES = """
for i in range(20):
    with open(f"f{i}", "wb") as f:
        f.write(b"x" * 8 * 2**20)
heap = bytearray(150 * 2**20)
"""


# Non-root mode: the watcher cannot open /proc/PID/map_files (that needs CAP_SYS_ADMIN or
# CAP_CHECKPOINT_RESTORE of the host) to size a file that only a mapping holds, so the program
# may not make one: each hog below is refused there, with this error
_REFUSED = {
    "memfds-mapped": "OSError: [Errno 38] Function not implemented",  # memfd_create
    "shared-anonymous": "refused: Operation not permitted",  # mmap MAP_SHARED|MAP_ANONYMOUS
    "dev-zero": "refused: No such device",  # the jail's /dev/zero is /dev/full
    "sysv": "refused: Function not implemented",  # shmget
}


@pytest.mark.parametrize(
    "hog",
    [
        pytest.param(_MEMFDS_MAPPED, id="memfds-mapped"),
        pytest.param(_SHARED_ANONYMOUS, id="shared-anonymous"),
        pytest.param(_DEV_ZERO, id="dev-zero"),
        pytest.param(_SYSV, id="sysv"),
        pytest.param(_WORK_FILES, id="work-files"),
    ],
)
def test_memory_held_in_files_counts_toward_the_limit(hog, request):
    """1 GiB in memfds that only a one-page mapping holds; 1 GiB of shared memory (anonymous,
    /dev/zero, SysV) mostly unmapped; 160 MiB of files in the work directory + a 150 MiB heap:
    each passes 256 MiB and the sandbox is killed for memory, not at the wall clock. In
    non-root mode, where mapped files cannot be sized, the first four are refused instead."""
    cfg = SandboxConfig(wall_s=10.0, cpu_s=10.0, memory_mb=256, disk_mb=200, file_size_mb=8)
    program = hog + "print('held all', flush=True)\nimport time\ntime.sleep(60)\n"
    result = run_sandboxed(program, "", cfg)
    assert "held all" not in result.stdout, result
    refused = None if ROOT else _REFUSED.get(request.node.callspec.id)
    if refused:
        assert result.returncode == 1 and refused in result.stderr, result
    else:
        assert result.killed_reason == "memory", result


def test_memory_put_in_files_shows_before_the_next_exact_count(tmp_path):
    """The watcher sizes files exactly every few polls; between two counts it reads how much the
    host's shared memory grew, so 1 GiB of memfds made in less than that interval (82-89 ms
    on the 2-core Xeon with AMX) is counted at the next poll: 64 MiB put in a memfd shows as grown, and an exact
    count, which sizes it, takes the growth back to about nothing."""
    files = sandbox_watch._Files(str(tmp_path), sized=True)
    files.count([os.getpid()])
    held, size = files.held, 64 * 2**20
    fd = os.memfd_create("rlsys-test")
    try:
        os.posix_fallocate(fd, 0, size)
        assert files.grown() > size - 8 * 2**20  # slack: the host may free some meanwhile
        files.count([os.getpid()])
        assert files.held - held > size - 8 * 2**20
        assert files.grown() < 8 * 2**20
    finally:
        os.close(fd)


def test_secret_memory_is_refused():
    """memfd_secret (447 on x86_64 and the generic table) makes memory on no device the
    watcher counts: it fails as on a kernel without it, in both modes."""
    program = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.syscall(447, 0), os.strerror(ctypes.get_errno()))\n"
    )
    result = run_sandboxed(program, "", SandboxConfig(wall_s=10.0))
    assert result.ok and result.stdout.strip() == "-1 Function not implemented", result


# ---- item 2: stdout and stderr hold no host disk --------------------------------------

_FALLOCATE_OUTPUT = (
    _LIBC
    + """
import stat
held = 0
for fd in (0, 1, 2):
    if libc.fallocate(fd, KEEP_SIZE, 0, 256 * 2**20) == 0:
        held += os.fstat(fd).st_blocks * 512
regular = [fd for fd in (1, 2) if stat.S_ISREG(os.fstat(fd).st_mode)]
print("held", held // 2**20, "MiB; regular files:", regular)
"""
)


def test_stdout_and_stderr_hold_no_host_disk():
    """fallocate(KEEP_SIZE) skips RLIMIT_FSIZE: on a host file as stdout it took 256 MiB of
    the host's disk per descriptor under disk_mb=32. stdout and stderr are pipes instead."""
    cfg = SandboxConfig(wall_s=20.0, disk_mb=32)
    result = run_sandboxed(_FALLOCATE_OUTPUT, "", cfg)
    assert result.ok, result
    assert result.stdout.strip() == "held 0 MiB; regular files: []", result


def test_output_past_the_cap_is_drained_and_flagged():
    """A program that prints 20 MiB to each stream is not blocked by the cap: it runs to its
    end, the head of each is kept and the run is flagged truncated."""
    spam = (
        "import os, sys\n"
        "chunk = b'y' * 2**20\n"
        "for _ in range(20):\n"
        "    sys.stdout.buffer.write(chunk)\n"
        "    sys.stderr.buffer.write(chunk)\n"
        "sys.stdout.flush()\n"
        "os.write(2, b'end')\n"
    )
    result = run_sandboxed(spam, "", SandboxConfig(wall_s=20.0), stdout_limit=1000)
    assert result.ok and result.stdout_truncated and result.truncated, result
    assert result.stdout == "y" * 1000 and result.stderr == "y" * sandbox.OUTPUT_LIMIT


# ---- item 7: keyrings -----------------------------------------------------------------

_KEYCTL = {"x86_64": (248, 249, 250), "aarch64": (217, 218, 219)}.get(os.uname().machine)
_GET_ID, _JOIN, _SEARCH = 0, 1, 10  # KEYCTL_* operations
_SESSION, _USER, _USER_SESSION = -3, -4, -5  # KEY_SPEC_* keyrings
_KEYRINGS = """
import ctypes, os
ADD_KEY, REQUEST_KEY, KEYCTL = {numbers}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long

def search(ring, desc):
    return libc.syscall(L(KEYCTL), L(10), L(ring), b"user", desc, L(0))

def read(key):
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(L(KEYCTL), L(11), L(key), buf, L(256))
    return buf.raw[:n] if n >= 0 else None

got = []
key = search(-3, {description!r})
if key > 0:
    got.append(("session", read(key)))
got.append(("serial", read({serial})))
key = libc.syscall(L(REQUEST_KEY), b"user", {description!r}, None, L(0))
if key > 0:
    got.append(("request_key", read(key)))
rings = [-3, -4, -5]
try:
    with open("/proc/keys") as f:
        rings += [int(line.split()[0], 16) for line in f if " keyring " in line]
except OSError:
    pass
leftover = [r for r in (-3, -4, -5) if search(r, {planted!r}) > 0]
planted = [r for r in rings
           if libc.syscall(L(ADD_KEY), b"user", {planted!r}, b"x", L(1), L(r)) > 0]
print("read", [g for g in got if g[1] is not None], "planted", len(planted),
      "left over from an earlier run", leftover)
"""


def _keyctl(*args) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    value = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    if value < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return value


@pytest.mark.skipif(_KEYCTL is None, reason="keyctl numbers known for x86_64 and aarch64")
def test_the_trainers_keyrings_are_out_of_reach(monkeypatch):
    """The trainer's session keyring holds a secret: the program can neither find nor read
    it, and keys it plants (in its session and user keyrings, or in any keyring /proc/keys
    shows it) are neither in the trainer's keyrings (session, user, user session) after the
    run nor found by the next run on the same uid."""
    add_key, _, keyctl = _KEYCTL
    description = f"rlsys-secret-{uuid.uuid4().hex}".encode()
    planted = f"rlsys-planted-{uuid.uuid4().hex}".encode()
    monkeypatch.setattr(sandbox, "_UID_SLOTS", 1)  # both runs get the same pool uid
    outcome: dict = {}

    def trainer() -> None:  # a thread: a session keyring of its own (credentials are per thread)
        _keyctl(keyctl, _JOIN, f"rlsys-test-{uuid.uuid4().hex}".encode())
        for ring in (_USER, _USER_SESSION):  # they exist, as where a login made them
            _keyctl(keyctl, _GET_ID, ring, 1)
        serial = _keyctl(add_key, b"user", description, b"the secret", 10, _SESSION)
        program = _KEYRINGS.format(
            numbers=_KEYCTL, description=description, serial=serial, planted=planted
        )
        outcome["runs"] = [run_sandboxed(program, "", SandboxConfig(wall_s=20.0)) for _ in "ab"]
        outcome["left"] = []
        for ring in (_SESSION, _USER, _USER_SESSION):
            try:
                outcome["left"].append(_keyctl(keyctl, _SEARCH, ring, b"user", planted, 0))
            except OSError as exc:
                assert exc.errno in (errno.ENOKEY, errno.ENOENT), exc

    thread = threading.Thread(target=trainer)
    thread.start()
    thread.join()
    first, second = outcome["runs"]
    for result in (first, second):
        assert result.ok, result
        assert result.stdout.startswith("read [] "), result
        assert result.stdout.rstrip().endswith("left over from an earlier run []"), result
    assert outcome["left"] == [], "a key the program planted is still in the trainer's keyrings"


# ---- item 8: CPU time of short-lived children ------------------------------------------

_SPIN = """
import os, time
def spin():
    end = time.process_time() + 0.004
    while time.process_time() < end:
        pass
    os.write(1, b"spent %f\\n" % time.process_time())
"""
_WAITED = (  # each child spins 4 ms and is waited for: its time goes to the parent's cutime
    _SPIN
    + """
while True:
    pid = os.fork()
    if pid == 0:
        spin()
        os._exit(0)
    os.waitpid(pid, 0)
    t = os.times()
    os.write(1, b"main %f\\n" % (t.user + t.system))
"""
)
_ORPHANED = (  # each grandchild spins 4 ms as an orphan: init reaps it
    _SPIN
    + """
while True:
    pid = os.fork()
    if pid == 0:
        if os.fork() == 0:
            spin()
        os._exit(0)
    os.waitpid(pid, 0)
    t = os.times()
    os.write(1, b"main %f\\n" % (t.user + t.system))
"""
)

# the parent ignores SIGCHLD: each child is reaped by no one, no cutime holds it. Under load the
# children wait for a CPU and many live at once: a fork refused at max_processes is retried
_NEVER_WAITED = (
    _SPIN
    + """
import signal
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
while True:
    try:
        pid = os.fork()
    except BlockingIOError:
        pid = -1
    if pid == 0:
        spin()
        os._exit(0)
    time.sleep(0.002)
    t = os.times()
    os.write(1, b"main %f\\n" % (t.user + t.system))
"""
)


@pytest.mark.parametrize(
    "hog", [_WAITED, _ORPHANED, _NEVER_WAITED], ids=["waited", "orphaned", "never-waited"]
)
def test_cpu_time_of_children_between_polls_counts(hog):
    """Children that live 4 ms, less than the watcher's 10 ms poll, each one waited for by the
    program, reaped by init as an orphan, or reaped by no one: the sandbox is killed for CPU
    time once they (with the program) have used about ``cpu_s``, not after several times
    that. (max_processes=64: under load more 4 ms children are alive at once than the default
    allows.)"""
    cfg = SandboxConfig(wall_s=10.0, cpu_s=1.0, max_processes=64)
    result = run_sandboxed(hog, "", cfg, stdout_limit=2**24)
    lines = [line.split() for line in result.stdout.splitlines()]
    children = sum(float(v) for kind, v in lines if kind == "spent")
    main = max((float(v) for kind, v in lines if kind == "main"), default=0.0)
    assert result.killed_reason == "cpu_time", (result.killed_reason, children, main)
    assert children + main < 1.25, (children, main)
