"""The RL run's elastic side: the rollout pool grows or shrinks between learner steps.

``RolloutScaler`` owns the size asked for (by ``rollout.elastic.schedule`` or ``rlsys scale
RUN_DIR rollout=N``: ``scale_requests.py``'s plan, which the controller polls); it works on the
``RunState`` it shares with the controller. The learner groups resize in ``learner_scaling.py``.

* Growing: new engines start while the others keep generating; then, with the learner idle
  and the loops held at the gate, the weight-sync group is re-formed with them and the
  current weights sent, and only then do their rollout loops start taking prompts.
* Shrinking: the loops of the last workers retire: each finishes the request it holds (its
  groups are scored and trained like any other), then ends; at a later step boundary their
  engines stop and the sync group is re-formed without them. Nothing is lost or counted
  twice: the buffer's accounting still balances.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import ray

from rlsys.config.elastic import ElasticConfig
from rlsys.trainers.rl.autoscale import Autoscaler
from rlsys.trainers.rl.state import RunState
from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


class RolloutScaler:
    """Resize the rollout pool of the run ``state`` (see the module docstring)."""

    def __init__(
        self,
        cfg: ElasticConfig,
        pools: Pools,
        state: RunState,
        ahead_steps: int = 0,
        unmet: Callable[[str, str, str], None] | None = None,
    ) -> None:
        """``ahead_steps``: batches generation may run ahead (``buffer.max_staleness``);
        ``unmet(pool, source, reason)`` hears of a size given up (``ScalePlan.unmet``)."""
        self.cfg, self.pools, self.state, self.unmet = cfg, pools, state, unmet
        self.target: int | None = None  # the size asked for; None: as started
        self._source = ""  # what asked for the target
        self.autoscaler = None
        if cfg.autoscale.enabled:
            self.autoscaler = Autoscaler(cfg.autoscale, ahead_steps)
        self._why: dict = {}  # an autoscale event's reason: source and the figures it used

    def after_step(
        self, step: int, wanted: tuple[int, str] | None, metrics: dict[str, float] | None = None
    ) -> None:
        """After learner step ``step``: take the new target size ``wanted`` (and what asked
        for it), else the autoscaler's decision on the step's ``metrics``, if any, and move
        the pool toward it (one change at a time: a shrink first finishes)."""
        current = len(self.state.pipeline.rollouts)
        if wanted is not None:
            self.target, self._source = wanted
            self._why = {}
            log.info("rollout pool: %d workers asked for by %s", self.target, self._source)
            if self.autoscaler is not None:
                self.autoscaler.restart()
        elif self.autoscaler is not None and metrics is not None:
            decision = self.autoscaler.observe(metrics, current)
            if decision is not None:
                self.target, self._source = decision.target, "autoscale"
                self._why = {"source": "autoscale", **decision.figures}
                log.info(
                    "rollout pool: autoscale asks for %d workers (learner idle %.2f, rollout "
                    "idle %.2f over the last steps)",
                    decision.target,
                    decision.figures["learner_idle_frac"],
                    decision.figures["rollout_idle_frac"],
                )
        if not self._reap_retired() or self.target is None:
            return
        pipeline = self.state.pipeline
        current = len(pipeline.rollouts)
        if self.target > current:
            self._grow(current, step)
        elif self.target < current:
            retiring = pipeline.retire_rollouts(current - self.target)
            self._record(step, current, self.target)
            log.info("rollout pool: retiring workers %s after their current requests", retiring)

    def _grow(self, current: int, step: int) -> None:
        """From ``current`` workers to the target: start the engines, then, with the learner
        idle and the loops held, give them the sync group and the current weights."""
        count = self.target - current
        state, timeout_s = self.state, self.cfg.start_timeout_s
        with state.weights_lock:  # the learner is idle: the engines hold state.version
            try:
                new = self.pools.rollout.grow(count, timeout_s)
            except ray.exceptions.GetTimeoutError:
                why = (
                    f"{count} more workers did not start within rollout.elastic.start_timeout_s"
                    f"={timeout_s:g} s (no room in the cluster?)"
                )
                log.warning("rollout pool: %s; staying at %d workers", why, current)
                self.target = current
                if self.unmet is not None:
                    self.unmet("rollout", self._source, why)
                return
            with state.pipeline.gate.shut():
                self.pools.connect_weight_sync()
                self.pools.sync_weights(state.version)
        for worker in new:
            state.pipeline.add_rollout(worker)
        self._record(step, current, current + count)

    def _reap_retired(self) -> bool:
        """Stop the engines of retired loops that have ended and re-form the sync group
        without them; False while one is still finishing its request."""
        pipeline = self.state.pipeline
        workers = pipeline.retired()
        if workers is None:
            return False
        if workers:
            with self.state.weights_lock, pipeline.gate.shut():
                self.pools.rollout.shrink(workers)
                self.pools.connect_weight_sync()
            log.info("rollout pool: workers %s stopped", workers)
        return True

    def drop_retired(self) -> None:
        """With the pipeline stopped (a recovery): stop retired workers' engines; the
        recovery re-forms the sync group."""
        workers = self.state.pipeline.retired()
        if workers:
            self.pools.rollout.shrink(workers)

    def _record(self, step: int, before: int, after: int) -> None:
        log.info("rollout pool: %d -> %d workers after step %d", before, after, step)
        event = {"step": step, "pool": "rollout", "from": before, "to": after, **self._why}
        self.state.totals.scale_events.append(event)
