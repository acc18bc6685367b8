"""The controller's elastic side: the rollout pool grows or shrinks between learner steps.

A mixin of ``Controller`` (it uses the controller's pools, pipeline, version, weights lock
and totals), kept apart so ``controller.py`` reads like the algorithm. What asks for a size:
``rollout.elastic.schedule`` and ``rlsys scale RUN_DIR rollout=N`` (``rlsys.trainers.rl.scale_requests``).

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

import ray

log = logging.getLogger(__name__)


class Elastic:
    """Resize the rollout pool of a ``Controller`` (see the module docstring)."""

    def _rescale(self, step: int) -> None:
        """After learner step ``step``: take a new target size, if one was asked for, and
        move the pool toward it (one change at a time: a shrink first finishes)."""
        wanted = self.scale_plan.poll(step)
        if wanted is not None:
            self._rollout_target, source = wanted
            log.info("rollout pool: %d workers asked for by %s", self._rollout_target, source)
        if not self._reap_retired() or self._rollout_target is None:
            return
        current = len(self.pipeline.rollouts)
        if self._rollout_target > current:
            self._grow(current, step)
        elif self._rollout_target < current:
            retiring = self.pipeline.retire_rollouts(current - self._rollout_target)
            self._record_scale(step, current, self._rollout_target)
            log.info("rollout pool: retiring workers %s after their current requests", retiring)

    def _grow(self, current: int, step: int) -> None:
        """From ``current`` workers to the target: start the engines, then, with the learner
        idle and the loops held, give them the sync group and the current weights."""
        count = self._rollout_target - current
        timeout_s = self.cfg.rollout.elastic.start_timeout_s
        with self._weights_lock:  # the learner is idle: the engines hold self.version
            try:
                new = self.pools.rollout.grow(count, timeout_s)
            except ray.exceptions.GetTimeoutError:
                log.warning(
                    "rollout pool: %d more workers did not start within "
                    "rollout.elastic.start_timeout_s=%g s (no room in the cluster?); staying "
                    "at %d workers",
                    count,
                    timeout_s,
                    current,
                )
                self._rollout_target = current
                return
            with self.pipeline.gate.shut():
                self.pools.connect_weight_sync()
                self.pools.sync_weights(self.version)
        for worker in new:
            self.pipeline.add_rollout(worker)
        self._record_scale(step, current, current + count)

    def _reap_retired(self) -> bool:
        """Stop the engines of retired loops that have ended and re-form the sync group
        without them; False while one is still finishing its request."""
        workers = self.pipeline.retired()
        if workers is None:
            return False
        if workers:
            with self._weights_lock, self.pipeline.gate.shut():
                self.pools.rollout.shrink(workers)
                self.pools.connect_weight_sync()
            log.info("rollout pool: workers %s stopped", workers)
        return True

    def _drop_retired(self) -> None:
        """With the pipeline stopped (a recovery): stop retired workers' engines; the
        recovery re-forms the sync group."""
        workers = self.pipeline.retired()
        if workers:
            self.pools.rollout.shrink(workers)

    def _record_scale(self, step: int, before: int, after: int) -> None:
        log.info("rollout pool: %d -> %d workers after step %d", before, after, step)
        self.totals.scale_events.append({"step": step, "from": before, "to": after})
