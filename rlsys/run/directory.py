"""A run's output directory: config.yaml, metrics.jsonl, summary.json, checkpoints/, cluster.json
and .lock (its owner: ``rlsys.run.lock``)."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.config.loader import to_yaml
from rlsys.config.schema import TrainConfig
from rlsys.run.lock import check_not_in_use, lock_run_dir

log = logging.getLogger(__name__)


RUN_FILES = ("metrics.jsonl", "samples.jsonl", "summary.json", "checkpoints")  # "a run is here"
CLUSTER_FILE = "cluster.json"  # the Ray resources the run found (record_cluster)


def check_output_dir(cfg: TrainConfig) -> None:
    """Create ``run.output_dir`` (not yet a run directory in it) or raise ConfigError naming
    why it cannot be: checked before the seconds of loading a model."""
    path = Path(cfg.run.output_dir).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        problem = None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
    except OSError as exc:
        problem = f"{exc.strerror}: {exc.filename}"
    if problem:
        raise ConfigError(
            f"run.output_dir={cfg.run.output_dir}: cannot create the run directory there "
            f"({problem}); set run.output_dir to a directory you can write"
        )


def make_run_dir(cfg: TrainConfig, kind: str = "train", restart: bool = False) -> Path:
    """Create ``<run.output_dir>/<run.name or kind-timestamp>``, take its lock (this process
    owns it: ``rlsys.run.lock``) and write the resolved config.

    A directory that already holds a run is refused (its records would mix with the new
    run's), unless ``restart``: ``resume=auto`` found no checkpoint in it, so the run starts
    over there and the old run's metrics and samples are dropped. One a live process owns is
    refused either way (RunDirInUse)."""
    name = cfg.run.name or f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.run.output_dir).resolve() / name
    suffix = 1
    while not cfg.run.name and run_dir.exists():  # another unnamed run started this second
        suffix += 1
        run_dir = run_dir.with_name(f"{name}-{suffix}")
    held = [f for f in RUN_FILES if (run_dir / f).exists()]
    if held and not restart:  # refused as it is: not even its lock's record changes
        check_not_in_use(run_dir, f"run.name={name}")
        raise ConfigError(
            f"run.name={name}: {run_dir} already holds a run ({', '.join(held)}); pass "
            "resume=auto to continue it, choose another run.name, or move that directory away"
        )
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        lock_run_dir(run_dir, f"run.name={name}")  # before its records are trimmed
    except OSError as exc:
        raise _unwritable(cfg, run_dir, exc) from exc
    for records in ("metrics.jsonl", "samples.jsonl"):
        if held and trim_metrics(run_dir, -1, records):
            log.info("resume=auto: no checkpoint in %s, starting over (%s reset)", run_dir, records)
    try:
        (run_dir / "config.yaml").write_text(to_yaml(cfg))
    except OSError as exc:
        raise _unwritable(cfg, run_dir, exc) from exc
    return run_dir


def _unwritable(cfg: TrainConfig, run_dir: Path, exc: OSError) -> ConfigError:
    return ConfigError(
        f"run.output_dir={cfg.run.output_dir}: cannot create the run directory {run_dir} "
        f"({exc.strerror}: {exc.filename}); set run.output_dir to a directory you can write"
    )


def record_cluster(run_dir: Path, resources: dict[str, float]) -> None:
    """Write ``cluster.json``: the Ray resources the run found when it joined the cluster
    (``rlsys scale`` bounds the pool sizes it asks for by them)."""
    record = {"resources": resources, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = run_dir / ".cluster.json.tmp"
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, run_dir / CLUSTER_FILE)


def recorded_cluster(run_dir: Path) -> dict[str, float] | None:
    """The Ray resources ``cluster.json`` records (None: the run wrote none)."""
    try:
        resources = json.loads((run_dir / CLUSTER_FILE).read_text())["resources"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return resources if isinstance(resources, dict) else None


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
