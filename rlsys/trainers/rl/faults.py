"""Telling a dead worker process from a bug, and counting the restarts a run may make."""

from __future__ import annotations

from dataclasses import dataclass

import ray

from rlsys.workers.pools import Pools

PROBE_TIMEOUT_S = 10.0  # a rank that does not answer this fast (stuck in a collective) is dead


def is_actor_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) came from Ray: a worker died, or a task on one failed
    (a learner rank whose peer died fails its collective)."""
    while exc is not None:
        if isinstance(exc, ray.exceptions.RayError):
            return True
        exc = exc.__cause__
    return False


def _alive(actor) -> bool:
    try:
        ready, _ = ray.wait([actor.__ray_ready__.remote()], timeout=PROBE_TIMEOUT_S)
        if not ready:
            return False
        ray.get(ready)
        return True
    except ray.exceptions.RayError:
        return False


@dataclass(frozen=True)
class DeadActors:
    """What a probe found dead (or stuck) after a failed step."""

    learners: bool  # a policy or critic rank
    reference: bool  # a reference rank
    rollout: list[int]  # rollout workers

    def __str__(self) -> str:
        found = [
            what
            for what, died in (
                ("a learner or critic rank died", self.learners),
                ("a reference rank died", self.reference),
                (f"rollout workers {self.rollout} died", self.rollout),
            )
            if died
        ]
        return "; ".join(found) or "no process died"


def dead_actors(pools: Pools) -> DeadActors:
    """Probe every learner, critic and reference rank and every rollout worker. Call when no
    step is running."""
    ranks = list(pools.learner.workers)
    if pools.critic is not None:
        ranks += pools.critic.workers
    reference = pools.reference.workers if pools.reference is not None else []
    return DeadActors(
        learners=not all(_alive(w) for w in ranks),
        reference=not all(_alive(w) for w in reference),
        rollout=[i for i, w in enumerate(pools.rollout.workers) if not _alive(w)],
    )


@dataclass
class Restarts:
    """Worker processes replaced so far in this run (process lifetime, not checkpointed)."""

    rollout: int = 0
    learner: int = 0

    def count(self, kind: str, limit: int, cause: BaseException) -> None:
        """Count one restart of ``kind``; raise once ``limit`` restarts are used up."""
        used = getattr(self, kind)
        if used >= limit:
            raise RuntimeError(
                f"a {kind} worker died again after {used} restarts (fault.max_{kind}_restarts="
                f"{limit}): giving up. Look at the worker's log for the cause (out of memory, a "
                f"crash), or raise fault.max_{kind}_restarts; resume=auto continues from the "
                f"latest checkpoint: {cause}"
            ) from cause
        setattr(self, kind, used + 1)


def nonfinite_streak(streak: int, skipped: float, limit: int, resume_hint: str) -> int:
    """The run of consecutive learner steps with an optimizer step skipped for a non-finite
    loss or gradient norm, after a step that skipped ``skipped``; raises once it reaches
    ``limit`` (``fault.max_nonfinite_steps``), naming ``resume_hint`` to go back to."""
    if not skipped:
        return 0
    streak += 1
    if streak >= limit:
        raise RuntimeError(
            f"{streak} learner steps in a row (fault.max_nonfinite_steps={limit}) had a "
            "non-finite loss or gradient norm: the run diverged. Resume from an earlier "
            f"checkpoint ({resume_hint}) with a lower learner.optim.lr, or check the rewards "
            "and the data"
        )
    return streak
