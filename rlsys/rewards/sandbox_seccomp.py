"""System calls of the code sandbox's launcher (``sandbox_launcher.py``), by name and by
number: libc's wrappers, each machine's system call table, and the program's seccomp filter.

The launcher imports this file (from its own directory: it runs as ``python -I -S -B``) before
it builds the jail, so like the launcher it imports only a few standard library modules and
never rlsys.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

# System call numbers the launcher calls (pivot_root, keyctl) or its seccomp filter denies,
# per machine, with the machine's seccomp audit arch. aarch64 and riscv64 share the kernel's
# generic table (asm-generic/unistd.h); any other machine has no filter table, and isolated
# runs refuse there (``sandbox_launcher._syscall_table``).
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
    "mmap": 222,
    "memfd_create": 279,
    "memfd_secret": 447,
    "shmget": 194,
}
SYSCALLS = {
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
            "mmap": 9,
            "memfd_create": 319,
            "memfd_secret": 447,
            "shmget": 29,
        },
    ),
    "aarch64": (0xC00000B7, _GENERIC_SYSCALLS),
    "riscv64": (0xC00000F3, _GENERIC_SYSCALLS),
}
# The seccomp filter's deny-list (the program's, installed last before execve):
_ENOSYS_CALLS = ("add_key", "request_key", "keyctl", "clone3")  # clone3: glibc falls back
_ENOSYS_CALLS += ("memfd_secret",)  # its memory is on no device the watcher counts
# Without map_files (non-root mode) the watcher cannot size a shared memory file that only a
# mapping holds: the ways to make one fail as on kernels without them (memfds, SysV segments),
# and a shared anonymous mapping with EPERM
_UNSIZED_ENOSYS_CALLS = ("memfd_create", "shmget")
_MAP_SHARED_ANONYMOUS = 0x21  # mmap flags: MAP_SHARED (or MAP_SHARED_VALIDATE) | MAP_ANONYMOUS
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
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER, _SECCOMP_RET_ALLOW, _SECCOMP_RET_ERRNO = 2, 0x7FFF0000, 0x00050000
_BPF_LD_ABS_W, _BPF_JEQ_K, _BPF_JGE_K, _BPF_JSET_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_BPF_AND_K = 0x54


_libc: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The C library (loaded on first use)."""
    global _libc
    _libc = _libc or ctypes.CDLL(None, use_errno=True)
    return _libc


def libc_call(name: str, *args) -> None:
    if getattr(libc(), name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args!r}: {os.strerror(err)}")


def _filter_program(
    arch: int, numbers: dict[str, int], sized: bool
) -> list[tuple[int, int, int, int]]:
    """The classic BPF program of ``deny_syscalls``: (code, jump if true, jump if false, k)."""
    low = 4 if sys.byteorder == "big" else 0  # the low 32 bits of a 64-bit argument

    def arg(index: int) -> tuple:
        return (_BPF_LD_ABS_W, 0, 0, 16 + 8 * index + low)  # seccomp_data.args[index]

    # jumps name a label; the labels' returns and argument checks follow the number checks
    code: list[tuple] = [
        (_BPF_LD_ABS_W, 0, 0, 4),  # seccomp_data.arch
        (_BPF_JEQ_K, 0, "enosys", arch),
        (_BPF_LD_ABS_W, 0, 0, 0),  # seccomp_data.nr
    ]
    if arch == SYSCALLS["x86_64"][0]:
        code.append((_BPF_JGE_K, "enosys", 0, _X32_SYSCALL_BIT))
    branches = {"socket": "socket", "clone": "clone", "unshare": "unshare"}
    branches.update({"mknod": "mknod", "mknodat": "mknodat"})
    enosys = _ENOSYS_CALLS if sized else _ENOSYS_CALLS + _UNSIZED_ENOSYS_CALLS
    if not sized:
        branches["mmap"] = "mmap"
    for names, label in ((enosys, "enosys"), (_EPERM_CALLS, "eperm")):
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
    if not sized:  # mmap(addr, length, prot, flags, fd, offset)
        block(
            "mmap",
            arg(3),
            (_BPF_AND_K, 0, 0, _MAP_SHARED_ANONYMOUS),
            (_BPF_JEQ_K, "eperm", 0, _MAP_SHARED_ANONYMOUS),
            allow,
        )
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


def deny_syscalls(table: tuple[int, dict[str, int]] | None, sized: bool) -> None:
    """The program's seccomp filter (after no_new_privs, right before execve, so that it holds
    for the program and all it starts, and never for init). It fails with

    * ENOSYS: add_key, request_key and keyctl (the trainer's keyrings), clone3 (its flags are
      out of a filter's reach; glibc then falls back to clone), memfd_secret, and every system
      call of another ABI (i386, x32) that could reach the rest by other numbers;
    * EPERM: io_uring, bpf, perf_event_open, userfaultfd, the mount family (mount, umount2,
      pivot_root, chroot, the new mount API), setns, ptrace and process_vm_readv/writev and
      pidfd_getfd, open_by_handle_at, the kernel's administration (modules, kexec, reboot,
      swap, acct, syslog, x86 I/O ports), clone and unshare with any new namespace flag, and
      mknod of a character or block device (a FIFO is fine);
    * EAFNOSUPPORT: socket() of AF_NETLINK and AF_VSOCK;
    * unless ``sized`` (the watcher can size mapped files through /proc/PID/map_files: root
      mode), also ENOSYS for memfd_create and shmget and EPERM for mmap with MAP_SHARED and
      MAP_ANONYMOUS together: the files that outlive their descriptor in memory the watcher
      would count only as far as they are mapped and resident.

    ``table``: this machine's (``sandbox_launcher._syscall_table``). Isolated runs need one (a
    machine without a table in ``SYSCALLS`` refuses them); without one (unsafe mode) the program
    runs unfiltered."""
    if table is None:
        return
    program = _filter_program(*table, sized=sized)

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
        libc_call("prctl", _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        raise OSError(
            exc.errno,
            "this kernel has no seccomp filters (CONFIG_SECCOMP_FILTER), which the jail needs: "
            "run code rewards on a kernel built with them, or set "
            "reward.sandbox.unsafe_no_isolation=true to run them unjailed",
        ) from None
