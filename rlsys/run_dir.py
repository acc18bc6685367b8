"""A run's output directory: config.yaml, metrics.jsonl, summary.json, checkpoints/."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from rlsys.config.loader import to_yaml
from rlsys.config.schema import TrainConfig


def make_run_dir(cfg: TrainConfig, kind: str = "train") -> Path:
    """Create ``<run.output_dir>/<run.name or kind-timestamp>`` and write the resolved config."""
    name = cfg.run.name or f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.run.output_dir).resolve() / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    return run_dir


def write_summary(run_dir: Path, summary: dict) -> Path:
    """Write ``summary.json`` atomically and return its path."""
    path = run_dir / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def trim_metrics(run_dir: Path, last_step: int, name: str = "metrics.jsonl") -> int:
    """Drop records after ``last_step`` from ``name`` (``metrics.jsonl``, ``samples.jsonl``:
    a resumed run logs those steps again); returns how many were dropped."""
    path = run_dir / name
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            dropped += 1  # a line cut short by the crash
            continue
        if step <= last_step:
            kept.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return dropped
