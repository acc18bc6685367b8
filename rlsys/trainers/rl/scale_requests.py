"""Resize requests for a running run's pools: ``rlsys scale RUN_DIR rollout=N learner=M``
writes one, the run's schedules (``rollout.elastic.schedule``, ``learner.elastic.schedule``,
``critic.elastic.schedule``) make others, and ``ScalePlan`` tells the controller, after each
learner step, the sizes the pools should have.

A request is a small JSON file in the run directory (``scale.json``), replaced atomically,
so it works wherever the run directory is reachable (a laptop, a shared file system, a
``kubectl exec`` into the head pod) and survives a crash of the requester. It keeps the
latest size asked for each pool, each with the time it was asked, so a request for one pool
does not undo a request for another the run has not taken yet.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REQUEST_FILE = "scale.json"
POOLS = ("rollout", "learner", "critic")  # the pools that resize while a run trains
# the metric each step logs with the pool's size
METRIC = {"rollout": "rollout_workers", "learner": "learner_ranks", "critic": "critic_ranks"}


class ScaleError(ValueError):
    """A resize request that cannot be taken; the message names the input and the fix."""


def _parse(targets: list[str]) -> dict[str, int]:
    sizes = {}
    for target in targets:
        pool, _, value = target.partition("=")
        if pool not in POOLS:
            raise ScaleError(
                f"{target!r}: the pools that resize while a run trains are {list(POOLS)}, "
                "e.g. rollout=4 or learner=2"
            )
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size < 1:
            raise ScaleError(f"{target!r}: give a size of 1 or more, e.g. {pool}=2")
        sizes[pool] = size
    return sizes


def _check_learner_sizes(run: Path, sizes: dict[str, int]) -> None:
    """Refuse learner-group sizes the run's config cannot take (DeepSpeed, a batch too small
    for the ranks, no critic), before the run sees them."""
    from rlsys.config.elastic import resized
    from rlsys.config.errors import ConfigError
    from rlsys.config.loader import load_run_config

    groups = {pool: size for pool, size in sizes.items() if pool != "rollout"}
    if not groups:
        return
    try:
        cfg = load_run_config(run / "config.yaml")
        if "learner" in groups and cfg.algorithm.uses_critic:
            groups.setdefault("critic", groups["learner"])  # the critic follows the learner
        resized(cfg, groups)
    except ConfigError as exc:
        raise ScaleError(str(exc)) from exc


def _previous(path: Path) -> dict:
    try:
        request = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"sizes": {}, "requested_at": {}}
    if not isinstance(request.get("requested_at"), dict):  # one time for all its pools
        request["requested_at"] = {pool: request["requested_at"] for pool in request["sizes"]}
    return request


def request_scale(run_dir: str | Path, targets: list[str]) -> str:
    """Ask the run in ``run_dir`` to resize its pools (``["rollout=4", "learner=2"]``);
    returns a line for the user. The run applies it after its current learner step."""
    run = Path(run_dir).expanduser()
    if not (run / "config.yaml").is_file():
        raise ScaleError(f"{run} holds no config.yaml: give the run's directory")
    if (run / "summary.json").is_file():
        raise ScaleError(f"the run in {run} has finished (summary.json exists)")
    sizes = _parse(targets)
    _check_learner_sizes(run, sizes)
    request = _previous(run / REQUEST_FILE)
    now = time.time()
    for pool, size in sizes.items():
        request["sizes"][pool], request["requested_at"][pool] = size, now
    tmp = run / f".{REQUEST_FILE}.tmp"
    tmp.write_text(json.dumps(request))
    os.replace(tmp, run / REQUEST_FILE)
    wanted = " ".join(f"{pool}={size}" for pool, size in sizes.items())
    metrics = ", ".join(f"pool/{METRIC[pool]}" for pool in sizes)
    return (
        f"requested {wanted} for {run}; the run applies it after its current step "
        f"(metrics: {metrics})"
    )


class ScalePlan:
    """The pool sizes a run should have after each step: per pool, the latest of its
    schedule's entries and ``rlsys scale`` requests (a pool absent: no change asked since
    the last call)."""

    def __init__(self, schedules: dict[str, dict[int, int]], run_dir: Path | None) -> None:
        self.schedules = {
            pool: {int(step): int(size) for step, size in schedule.items()}
            for pool, schedule in schedules.items()
        }
        self.path = run_dir / REQUEST_FILE if run_dir is not None else None
        # none seen: a request made before a resume is applied again (the user's latest word)
        self._seen: dict[str, float] = {}

    def _request(self) -> dict | None:
        return _previous(self.path) if self.path is not None and self.path.exists() else None

    def poll(self, step: int) -> dict[str, tuple[int, str]]:
        """New target sizes after learner step ``step`` by pool, and what asked for each."""
        wanted = {}
        for pool, schedule in self.schedules.items():
            if step in schedule:
                wanted[pool] = (schedule[step], f"{pool}.elastic.schedule at step {step}")
        request = self._request()
        for pool, at in (request or {}).get("requested_at", {}).items():
            if self._seen.get(pool) != at:
                self._seen[pool] = at
                wanted[pool] = (request["sizes"][pool], "rlsys scale")
        return wanted
