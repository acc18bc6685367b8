"""Resize requests for a running run's rollout pool: ``rlsys scale RUN_DIR rollout=N`` writes
one, the run's schedule (``rollout.elastic.schedule``) makes others, and ``ScalePlan`` tells
the controller, after each learner step, the pool size it should have.

A request is a small JSON file in the run directory (``scale.json``), replaced atomically,
so it works wherever the run directory is reachable (a laptop, a shared file system, a
``kubectl exec`` into the head pod) and survives a crash of the requester.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

REQUEST_FILE = "scale.json"
POOLS = ("rollout",)  # the pools that resize while a run trains


class ScaleError(ValueError):
    """A resize request that cannot be taken; the message names the input and the fix."""


def _parse(targets: list[str]) -> dict[str, int]:
    sizes = {}
    for target in targets:
        pool, _, value = target.partition("=")
        if pool not in POOLS:
            raise ScaleError(
                f"{target!r}: only the rollout pool resizes while a run trains (rollout=N); "
                "to change learner.world_size, stop the run and start it again with "
                "resume=auto and the new size"
            )
        try:
            size = int(value)
        except ValueError:
            size = 0
        if size < 1:
            raise ScaleError(f"{target!r}: give a worker count of 1 or more, e.g. rollout=4")
        sizes[pool] = size
    return sizes


def request_scale(run_dir: str | Path, targets: list[str]) -> str:
    """Ask the run in ``run_dir`` to resize its pools (``["rollout=4"]``); returns a line
    for the user. The run applies it after its current learner step."""
    run = Path(run_dir).expanduser()
    if not (run / "config.yaml").is_file():
        raise ScaleError(f"{run} holds no config.yaml: give the run's directory")
    if (run / "summary.json").is_file():
        raise ScaleError(f"the run in {run} has finished (summary.json exists)")
    sizes = _parse(targets)
    request = {"sizes": sizes, "requested_at": time.time()}
    tmp = run / f".{REQUEST_FILE}.tmp"
    tmp.write_text(json.dumps(request))
    os.replace(tmp, run / REQUEST_FILE)
    wanted = " ".join(f"{pool}={size}" for pool, size in sizes.items())
    return (
        f"requested {wanted} for {run}; the run applies it after its current step "
        "(metrics: pool/rollout_workers)"
    )


class ScalePlan:
    """The rollout pool size a run should have after each step: the latest of its schedule
    entries and ``rlsys scale`` requests (None: no change asked since the last call)."""

    def __init__(self, schedule: dict[int, int], run_dir: Path | None) -> None:
        self.schedule = {int(step): int(size) for step, size in schedule.items()}
        self.path = run_dir / REQUEST_FILE if run_dir is not None else None
        # None: a request made before a resume is applied again (it is the user's latest word)
        self._seen: float | None = None

    def _request(self) -> dict | None:
        try:
            return json.loads(self.path.read_text()) if self.path else None
        except (OSError, ValueError):
            return None

    def poll(self, step: int) -> tuple[int, str] | None:
        """A new target size after learner step ``step``, and what asked for it."""
        wanted = None
        if step in self.schedule:
            wanted = (self.schedule[step], f"rollout.elastic.schedule at step {step}")
        request = self._request()
        if request is not None and request["requested_at"] != self._seen:
            self._seen = request["requested_at"]
            wanted = (request["sizes"]["rollout"], "rlsys scale")
        return wanted
