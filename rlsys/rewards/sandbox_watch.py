"""Init's watcher in the code sandbox (``sandbox_launcher.py`` runs it in the sandbox's init,
once the program's process is started): it waits for the program, reaps orphans, and every
``_POLL_S`` adds up the memory and CPU time of all the sandbox's processes, killing them all
when a total passes its limit.

The launcher imports this file (from its own directory: it runs as ``python -I -S -B``) before
it builds the jail, so like the launcher it imports only a few standard library modules and
never rlsys.
"""

from __future__ import annotations

import itertools
import os
import resource
import select
import signal
import time

_POLL_S = 0.01  # how often init adds up the sandbox's memory and CPU time
_FILES_EVERY = 10  # polls between counts of memory held in files (memfd, SysV shm)
_UNKNOWN_PSS = 1 << 62  # smaps_rollup unreadable: trust the resident upper bound
_TICKS = os.sysconf("SC_CLK_TCK")
_PID_MAX = 1 << 22  # pids wrap below this (the kernel's largest pid_max)


def watch(pid: int, limits: dict, work: str, sized: bool) -> tuple[int, str | None]:
    """Wait for the program (``pid``), reaping every orphan; every ``_POLL_S`` add up the
    sandbox's memory and CPU time over all its processes (``work``: the program's directory,
    a tmpfs; ``sized``: ``sizes_mapped_files()``) and kill them all once a total passes
    ``memory_mb`` or ``cpu_s``. Returns (wait status, the limit passed)."""
    memory_limit = limits["memory_mb"] * 1024 * 1024
    clock = _CpuClock()
    files = _Files(work, sized)
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
        anon = sum(p.anon for p in procs.values())
        shmem = sum(p.shmem for p in procs.values())
        # count now if the host's shared memory grew by enough since the last count to put the
        # sandbox past its limit: memory in files that nothing maps resident (a memfd with one
        # page mapped) grows faster than one count every _FILES_EVERY polls sees
        counted = poll % _FILES_EVERY == 0 or (
            anon + files.beside(shmem) + files.grown() > memory_limit
        )
        if counted:
            files.count(pids)
        exceeded = None
        if anon + files.beside(shmem) > memory_limit:
            if not counted:
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


def sizes_mapped_files() -> bool:
    """Whether this process can size the files other processes map, through
    /proc/PID/map_files (it needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE in the host's user
    namespace: root mode, not non-root mode)."""
    with open("/proc/self/maps") as f:
        first = f.readline().split()[0]
    try:
        os.stat(f"/proc/self/map_files/{first}")
    except OSError:
        return False
    return True


class _Files:
    """Memory the sandbox holds in files, each file once by its allocated blocks: shared memory
    files (memfds, shared anonymous mappings) its processes keep open or mapped, SysV segments
    of its IPC namespace, and the files of its work directory (``work``, a tmpfs).

    ``sized``: the files a process only maps can be sized through /proc/PID/map_files
    (``sizes_mapped_files``: root mode). Without it (non-root mode) the mapped part is counted
    from the processes' shared resident memory instead, and a file held only by a mapping
    would count only as far as it is mapped and resident: there the program's seccomp filter
    refuses the ways to make one (``sandbox_seccomp.deny_syscalls``) and the jail's /dev/zero
    is /dev/full, which cannot be mapped."""

    def __init__(self, work: str, sized: bool) -> None:
        self.work = work
        self.held = 0  # bytes when last counted
        try:
            fd = os.memfd_create("rlsys-probe")  # shared memory files live on its device
        except OSError:  # no memfds here: nor for the program
            self.device, self.maps_device = -1, b""
        else:
            self.device = os.fstat(fd).st_dev
            os.close(fd)
            self.maps_device = b"%02x:%02x" % (os.major(self.device), os.minor(self.device))
        self.sized = sized
        self.host_shmem = _host_shmem()  # at the last count

    def grown(self) -> int:
        """Bytes the host's shared memory (memfds, SysV, tmpfs) gained since the last count:
        cheap, and an upper bound on what the sandbox put in files since, unless the host freed
        some meanwhile (the next periodic count then sees it)."""
        return max(0, _host_shmem() - self.host_shmem)

    def beside(self, shmem: int) -> int:
        """Held in files, given ``shmem`` resident bytes of shared memory mapped now: a cheap
        upper bound between exact counts (the last count may be up to _FILES_EVERY old)."""
        return max(shmem, self.held) if self.sized else shmem + self.held

    def count(self, pids: list[int]) -> None:
        """Count now (costlier: every descriptor, every mapping on the shared memory device)."""
        self.host_shmem = _host_shmem()  # before the count: what grows during it shows next
        files: dict[tuple[bool, int], int] = {}  # (SysV?, inode) -> bytes
        for pid in pids:
            self._descriptors(pid, files)
            if self.sized:
                self._mappings(pid, files)
        work = os.statvfs(self.work)
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


def _host_shmem() -> int:
    """The host's shared memory in bytes (``Shmem`` of /proc/meminfo, which no namespace
    scopes); 0 if unreadable (then only the periodic count sees memory in files)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            meminfo = f.read()
        start = meminfo.index(b"\nShmem:") + 7
        return int(meminfo[start : meminfo.index(b"kB", start)]) * 1024
    except (OSError, ValueError):
        return 0


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
