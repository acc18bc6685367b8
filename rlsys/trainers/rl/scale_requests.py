"""Resize requests for a running run's pools: ``rlsys scale RUN_DIR rollout=N learner=M``
writes one, the run's schedules (``rollout.elastic.schedule``, ``learner.elastic.schedule``,
``critic.elastic.schedule``) make others, and ``ScalePlan`` tells the controller, after each
learner step, the sizes the pools should have.

A request is a small JSON file in the run directory (``scale.json``), replaced atomically,
so it works wherever the run directory is reachable (a laptop, a shared file system, a
``kubectl exec`` into the head pod) and survives a crash of the requester. It keeps the
latest size asked for each pool, each with the time it was asked, so a request for one pool
does not undo a request for another the run has not taken yet.

Only a live run takes requests (a process holds the run directory's lock, ``rlsys.run.lock``),
and only sizes it can have (``check_sizes``): within ``rollout.elastic.autoscale``'s range
where that is on, and within the cluster the run recorded when it joined Ray
(``cluster.json``; without one, ``HARD_CAP`` per pool). The running run checks again against
the cluster as it is; a request it cannot meet is logged and dropped, and written to
``scale_refused.json`` so that a resumed run does not take it again either.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlsys.algorithms.traits import uses_critic
from rlsys.config.elastic import RESIZABLE_GROUPS
from rlsys.config.errors import ConfigError
from rlsys.resolve import resized
from rlsys.run.directory import CLUSTER_FILE, recorded_cluster
from rlsys.run.lock import LOCK_FILE, last_holder, live_holder

if TYPE_CHECKING:
    from rlsys.config.schema import TrainConfig
    from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)

REQUEST_FILE = "scale.json"
REFUSED_FILE = "scale_refused.json"  # requests the run dropped (written by the run alone)
REQUEST_SOURCE = "rlsys scale"
POOLS = ("rollout", "learner", "critic")  # the pools that resize while a run trains
# the metric each step logs with the pool's size
METRIC = {"rollout": "rollout_workers", "learner": "learner_ranks", "critic": "critic_ranks"}
# Rollout workers or ranks per pool `rlsys scale` asks for where the run recorded no cluster
# (cluster.json) to bound them by: a size past it is a typo more often than a plan.
HARD_CAP = 64


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


def _describe(resources: dict[str, float]) -> str:
    return f"{resources.get('CPU', 0.0):g} CPUs, {resources.get('GPU', 0.0):g} GPUs"


def check_sizes(
    cfg: TrainConfig,
    sizes: dict[str, int],
    resources: dict[str, float] | None,
    cluster: str = "the cluster",
) -> None:
    """Raise ScaleError unless a run of ``cfg`` can have its pools at ``sizes``
    (``{"rollout": 4, "learner": 2}``; a pool absent: as configured): the learner groups'
    config checks (backend, batch), ``rollout.elastic.autoscale``'s range where it is on, and
    room for every pool in ``resources`` (the Ray resources of ``cluster``; None: HARD_CAP)."""
    rollout, auto = sizes.get("rollout"), cfg.rollout.elastic.autoscale
    if rollout is not None and auto.enabled and not auto.min_workers <= rollout <= auto.max_workers:
        raise ScaleError(
            f"rollout={rollout}: rollout.elastic.autoscale is on and keeps the pool within "
            f"[rollout.elastic.autoscale.min_workers={auto.min_workers}, "
            f"rollout.elastic.autoscale.max_workers={auto.max_workers}]; ask within them, or "
            "resume the run with a wider range"
        )
    try:
        sized = resized(cfg, {k: n for k, n in sizes.items() if k in RESIZABLE_GROUPS})
        if rollout is not None:
            sized = dataclasses.replace(
                sized, rollout=dataclasses.replace(sized.rollout, num_workers=rollout)
            )
    except ConfigError as exc:
        raise ScaleError(str(exc)) from exc
    if resources is None:
        for pool, size in sizes.items():
            if size > HARD_CAP:
                raise ScaleError(
                    f"{pool}={size}: over rlsys scale's hard cap of {HARD_CAP} per pool, which "
                    f"holds where the run recorded no cluster to bound it by ({CLUSTER_FILE}, "
                    "written when the run joins Ray); ask for fewer"
                )
        return
    from rlsys.placement.resources import Roles, check_fits

    try:
        check_fits(
            sized,
            resources.get("CPU", 0.0),
            resources.get("GPU", 0.0),
            Roles.for_rl(cfg),
            resources,
        )
    except ConfigError as exc:
        asked = " ".join(f"{pool}={size}" for pool, size in sizes.items())
        raise ScaleError(
            f"{asked}: the pools would not fit {cluster} ({_describe(resources)}): {exc}"
        ) from exc


def live_check(cfg: TrainConfig, pools: Pools) -> Callable[[str, int], None]:
    """The check a running run applies to each request (``ScalePlan``'s ``check``): the
    other pools as they are now, in the cluster as Ray reports it now."""

    def check(pool: str, size: int) -> None:
        import ray

        sizes = {"rollout": len(pools.rollout.workers), "learner": len(pools.learner.workers)}
        if pools.critic is not None:
            sizes["critic"] = len(pools.critic.workers)
        if pool == "learner" and pools.critic is not None:
            sizes["critic"] = size  # the critic follows the learner unless asked on its own
        sizes[pool] = size
        resources = ray.cluster_resources() if ray.is_initialized() else None
        check_sizes(cfg, sizes, resources, "the cluster as Ray reports it now")

    return check


def _check_live(run: Path) -> None:
    """Refuse a directory no live process owns: a run that ended, crashed, or never was."""
    try:
        if live_holder(run) is not None:
            return
    except OSError as exc:
        raise ScaleError(
            f"cannot tell whether a run owns {run}: the file system refuses a lock on "
            f"{run / LOCK_FILE} ({exc.strerror})"
        ) from exc
    if (run / "summary.json").is_file():
        raise ScaleError(
            f"the run in {run} has finished (summary.json exists; no process holds "
            f"{run / LOCK_FILE})"
        )
    last = last_holder(run)
    was = f"; it was last held by {last}" if last else " (there is none)"
    raise ScaleError(
        f"{run} is not a live run: no process holds {run / LOCK_FILE}{was}. A run that "
        "crashed or stopped takes no requests: resume it (rlsys train ... resume=auto) with "
        "rollout.num_workers / learner.world_size at the sizes you want"
    )


def _check_request(run: Path, sizes: dict[str, int]) -> None:
    """Refuse sizes the run cannot have (``check_sizes``), against the cluster it recorded."""
    from rlsys.resolve import load_run_config

    try:
        # a live run of this machine (checked above): its plugins ran here already
        cfg = load_run_config(run / "config.yaml", plugins=True)
    except ConfigError as exc:
        raise ScaleError(str(exc)) from exc
    asked = dict(sizes)
    if "learner" in asked and uses_critic(cfg.algorithm):
        asked.setdefault("critic", asked["learner"])  # the critic follows the learner
    cluster = f"the cluster the run recorded when it joined Ray ({run / CLUSTER_FILE})"
    check_sizes(cfg, asked, recorded_cluster(run), cluster)


def _previous(path: Path) -> dict:
    try:
        request = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"sizes": {}, "requested_at": {}}
    if not isinstance(request.get("requested_at"), dict):  # one time for all its pools
        request["requested_at"] = {pool: request["requested_at"] for pool in request["sizes"]}
    return request


def request_scale(run_dir: str | Path, targets: list[str]) -> str:
    """Ask the live run in ``run_dir`` to resize its pools (``["rollout=4", "learner=2"]``);
    returns a line for the user. The run applies it after its current learner step."""
    run = Path(run_dir).expanduser()
    if not (run / "config.yaml").is_file():
        raise ScaleError(f"{run} holds no config.yaml: give the run's directory")
    sizes = _parse(targets)
    _check_live(run)
    _check_request(run, sizes)
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


def _refused(path: Path | None) -> dict[str, dict]:
    try:
        refused = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return refused if isinstance(refused, dict) else {}


class ScalePlan:
    """The pool sizes a run should have after each step: per pool, the latest of its
    schedule's entries and ``rlsys scale`` requests (a pool absent: no change asked since
    the last call). ``check(pool, size)`` raises ScaleError for a request the run cannot
    meet: it is dropped with a warning, as is one the run gave up on (``unmet``), and neither
    is taken again, after a resume either."""

    def __init__(
        self,
        schedules: dict[str, dict[int, int]],
        run_dir: Path | None,
        check: Callable[[str, int], None] | None = None,
    ) -> None:
        self.schedules = {
            pool: {int(step): int(size) for step, size in schedule.items()}
            for pool, schedule in schedules.items()
        }
        self.path = run_dir / REQUEST_FILE if run_dir is not None else None
        self.refused_path = run_dir / REFUSED_FILE if run_dir is not None else None
        self.check = check
        self._refused = _refused(self.refused_path)
        # none seen: a request made before a resume is applied again (the user's latest
        # word), unless the run dropped it
        self._seen: dict[str, float] = {
            pool: entry.get("requested_at")
            for pool, entry in self._refused.items()
            if isinstance(entry, dict)
        }

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
            if self._seen.get(pool) == at:
                continue
            self._seen[pool] = at
            size = request["sizes"][pool]
            try:
                if self.check is not None:
                    self.check(pool, size)
            except ScaleError as exc:
                self._drop(pool, size, str(exc))
                continue
            wanted[pool] = (size, REQUEST_SOURCE)
        return wanted

    def unmet(self, pool: str, source: str, reason: str) -> None:
        """The run gave up on the size ``source`` asked for ``pool`` (e.g. its workers found
        no room): a request is dropped, so a resumed run does not ask the cluster again."""
        request = self._request()
        if source == REQUEST_SOURCE and request is not None and pool in self._seen:
            self._drop(pool, request["sizes"].get(pool), reason)

    def _drop(self, pool: str, size: int | None, reason: str) -> None:
        log.warning(
            "rlsys scale %s=%s dropped, the run goes on at its size: %s", pool, size, reason
        )
        self._refused[pool] = {"requested_at": self._seen[pool], "size": size, "reason": reason}
        if self.refused_path is not None:
            tmp = self.refused_path.with_name(f".{REFUSED_FILE}.tmp")
            tmp.write_text(json.dumps(self._refused, indent=1) + "\n")
            os.replace(tmp, self.refused_path)
