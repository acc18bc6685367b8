"""What this machine can do: its CPU (model, cores, bf16 matmul units), a measured matmul
peak per dtype, a measured memory copy bandwidth, and GPUs' published peaks.

The measurements run in the calling process with its torch threads (a learner rank measures
with the threads it trains with), once per process and dtype (cached): a square matmul large
enough to reach the kernels' peak, and a copy of a buffer several times a CPU's last-level
cache, counted as the bytes read plus the bytes written (as STREAM's copy counts them). Each
repeats for a fixed time (``_MATMUL_S``, ``_COPY_S``) and keeps its fastest call: on a shared
2-core host the best of 2 calls of the 1,024-square fp32 matmul read 0.133-0.195 TFLOP/s
across six tries a second apart, the best of 30 read 0.179-0.195 (docs/roofline.md), and every
floor moves with the peak. About 0.3 s on a 2-core CPU.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass

import torch

# Dense (no sparsity) peak TFLOP/s from the vendors' data sheets, SXM parts; a name is
# matched by substring, first match wins. float32 is the non-tensor-core rate (no TF32).
PUBLISHED_TFLOPS = {
    "H200": {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
    "H100": {"bfloat16": 989.4, "float16": 989.4, "float32": 66.9},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5},
    "L40S": {"bfloat16": 362.1, "float16": 362.1},
    "A10G": {"bfloat16": 70.0, "float16": 70.0},
}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}  # sides of the timed square matmul
_COPY_BYTES = {"cpu": 64 << 20, "cuda": 1 << 30}  # a CPU's: twice its L3, at least
# each measurement repeats for this long (seconds), its best call kept: the matmul's is the
# noisier on a shared host (docs/roofline.md); the copy's best moved 5% between tries
_MATMUL_S = {"cpu": 0.2, "cuda": 0.2}
_COPY_S = {"cpu": 0.05, "cuda": 0.05}
_MIN_REPEATS = 3


@dataclass(frozen=True)
class CpuInfo:
    """The CPU as /proc/cpuinfo names it, the cores this process may use, and whether it has
    bf16 matmul units (AMX tiles) or bf16 dot-product instructions (avx512_bf16)."""

    model: str
    cores: int
    amx: bool
    avx512_bf16: bool

    def line(self) -> str:
        """One line for a benchmark's header."""
        yes = {True: "yes", False: "no"}
        return (
            f"CPU: {self.model}, {self.cores} cores, AMX {yes[self.amx]}, "
            f"avx512_bf16 {yes[self.avx512_bf16]}"
        )


@functools.cache
def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> CpuInfo:
    """This machine's CPU (the model from ``platform`` where /proc/cpuinfo is absent)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break  # the first processor's block says it for all
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return CpuInfo(model, cores or 1, "amx_bf16" in flags, "avx512_bf16" in flags)


@dataclass(frozen=True)
class CpuTimes:
    """All CPUs' time since boot in clock ticks (/proc/stat's first line): the total, and the
    part stolen (on a virtual machine, time the hypervisor gave another guest while this one
    had work: a load the load average does not show)."""

    total: int
    steal: int


def cpu_times(stat_path: str = "/proc/stat") -> CpuTimes | None:
    """This machine's CPU times now; None where /proc/stat is absent (not Linux)."""
    try:
        with open(stat_path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice]: the guest times are
    # already inside user and nice, so the total stops at steal
    ticks = [int(v) for v in fields[1:9]]
    return CpuTimes(sum(ticks), ticks[7] if len(ticks) > 7 else 0)


def steal_frac(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """The share of CPU time stolen between two readings of ``cpu_times``; None without
    them. On a 2-core guest, 0.25 means a core's worth of time went to other guests half
    the while: a benchmark's pair measured then is noisy."""
    if before is None or after is None:
        return None
    span = after.total - before.total
    return (after.steal - before.steal) / span if span > 0 else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn, device: torch.device, budget_s: float) -> float:
    """The fastest of ``fn``'s calls over ``budget_s`` seconds (at least ``_MIN_REPEATS``),
    after a warm-up call (kernel selection, allocator, page faults)."""
    fn()
    _sync(device)
    best, calls = float("inf"), 0
    start = time.perf_counter()
    while calls < _MIN_REPEATS or time.perf_counter() - start < budget_s:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best, calls = min(best, time.perf_counter() - t0), calls + 1
    return best


def matmul_tflops(dtype: str, device: torch.device, size: int | None = None) -> float:
    """Measured TFLOP/s of a square ``size`` matmul in ``dtype`` on ``device`` (its best call;
    2 x size^3 FLOPs each)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(_DTYPES)}")
    n = size or _MATMUL_SIZE.get(device.type, 4096)
    a = torch.randn(n, n, device=device).to(_DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(_DTYPES[dtype])
    seconds = _best_seconds(lambda: torch.mm(a, b), device, _MATMUL_S.get(device.type, 0.2))
    return 2.0 * n**3 / seconds / 1e12


def copy_gbps(device: torch.device, num_bytes: int | None = None) -> float:
    """Measured memory bandwidth in GB/s: one buffer copied into another, the bytes read plus
    the bytes written over its best call's time."""
    size = num_bytes or _COPY_BYTES.get(device.type, 1 << 30)
    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, _COPY_S.get(device.type, 0.05))
    return 2.0 * size / seconds / 1e9


def published_tflops(device_name: str | None, dtype: str) -> float | None:
    """A GPU's data-sheet dense peak in ``dtype`` (None: not a GPU in the table)."""
    for key, peaks in PUBLISHED_TFLOPS.items():
        if device_name and key in device_name:
            return peaks.get(dtype)
    return None


@dataclass(frozen=True)
class MachinePeak:
    """One device's roofline: the measured matmul peak in ``dtype``, the measured copy
    bandwidth, and a GPU's published peak (None on a CPU or an unknown GPU)."""

    device: str  # the CPU line or the GPU's name
    dtype: str
    threads: int  # torch threads the measurement ran with
    matmul_tflops: float
    copy_gbps: float
    published_tflops: float | None = None


@functools.cache
def measure(dtype: str, device_type: str = "cpu") -> MachinePeak:
    """This process's device's roofline in ``dtype``, measured once per process."""
    device = torch.device(device_type)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        published = published_tflops(name, dtype)
    else:
        name, published = cpu_info().line().removeprefix("CPU: "), None
    return MachinePeak(
        device=name,
        dtype=dtype,
        threads=torch.get_num_threads(),
        matmul_tflops=matmul_tflops(dtype, device),
        copy_gbps=copy_gbps(device),
        published_tflops=published,
    )
