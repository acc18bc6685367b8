"""Benchmark helper: one ``rlsys train`` run in a fresh process, read back from its run dir."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrainRun:
    """What a finished run left behind."""

    summary: dict  # summary.json
    metrics: list[dict]  # metrics.jsonl, one record per logged step
    process_wall_s: float  # the whole process, Ray start and warm start included


def run_train(
    name: str, overrides: list[str], out_dir: Path, timeout: float | None = None
) -> TrainRun:
    """Run ``rlsys train`` as ``<out_dir>/<name>`` with ``overrides`` (console logging off);
    raises with the tail of its stderr if it fails (``subprocess.TimeoutExpired`` past
    ``timeout`` seconds)."""
    command = [
        sys.executable,
        "-m",
        "rlsys.cli",
        "train",
        "tracking.console=false",
        f"run.output_dir={out_dir}",
        f"run.name={name}",
        *overrides,
    ]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"rlsys train {' '.join(overrides)} failed:\n{result.stderr[-4000:]}")
    run_dir = out_dir / name
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return TrainRun(
        json.loads((run_dir / "summary.json").read_text()),
        metrics,
        time.perf_counter() - started,
    )


def write_records(path: str | None, records: list[dict]) -> None:
    """Write a benchmark's records as a JSON list to ``path`` (``--json``), if given."""
    if path:
        Path(path).write_text(json.dumps(records, indent=2) + "\n")
        print(f"wrote {path}")


def peak_rss_bytes(pid: int) -> int | None:
    """The peak resident memory of process ``pid`` on this machine (``VmHWM``), or None
    where /proc does not tell (another OS, or the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
