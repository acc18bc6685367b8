"""The rollout pool's size from measured idle time (``rollout.elastic.autoscale``).

Two figures each step tell which side is short: ``pool/learner_idle_frac`` (the learner
waiting for a batch: generation is the bottleneck, add a rollout worker) and
``pool/rollout_idle_frac`` (the rollout workers not generating: held at the gate or by the
staleness bound, so the learner is the bottleneck and a worker can go). The autoscaler
averages them over ``window`` steps and moves the pool by one worker at a time within
``[min_workers, max_workers]``. Hysteresis: a shrink also needs the learner to have waited
at most half the grow threshold, so the smaller pool does not at once look short. Cooldown:
after any change (its own, a schedule's, a request's) it skips ``cooldown_steps`` steps and
measures afresh; in an asynchronous run it also skips ``buffer.max_staleness`` more steps,
since the batches generated ahead while the pool changed (the learner was paused) make the
next steps look as if the learner never waited. A grow that found no room in the cluster caps
the pool where it is.

Pure bookkeeping over the step metrics: ``RolloutScaler`` (scaling.py) carries the decisions
out and records each with the figures it used in summary.json's ``scale_events``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.elastic import AutoscaleConfig

LEARNER_IDLE, ROLLOUT_IDLE = "pool/learner_idle_frac", "pool/rollout_idle_frac"


@dataclass
class Decision:
    """Resize the pool to ``target``, because of ``figures`` (what the scale event records)."""

    target: int
    figures: dict[str, float]


class Autoscaler:
    """Decides rollout pool sizes from step metrics (see the module docstring)."""

    def __init__(self, cfg: AutoscaleConfig, ahead_steps: int = 0) -> None:
        """``ahead_steps``: batches generation may run ahead (``buffer.max_staleness``)."""
        self.cfg = cfg
        self.settle_steps = cfg.cooldown_steps + ahead_steps
        self.max_workers = cfg.max_workers  # lowered when the cluster has no room for more
        self._window: list[tuple[float, float]] = []
        self._skip = 0  # steps still to skip after a change
        self._asked: int | None = None  # the size last decided, until the pool reaches it

    def restart(self) -> None:
        """The pool changed size for another reason (a schedule, a request): measure afresh
        after the cooldown."""
        self._window.clear()
        self._skip = self.settle_steps
        self._asked = None

    def observe(self, metrics: dict[str, float], workers: int) -> Decision | None:
        """One step's metrics with the pool at ``workers`` active workers; a decision once
        ``window`` steps since the last change agree that one side is short."""
        if self._asked is not None:
            if workers < self._asked:  # a grow found no room: stay within what fits
                self.max_workers = max(workers, self.cfg.min_workers)
            self._asked = None
        if self._skip:
            self._skip -= 1
            return None
        if LEARNER_IDLE not in metrics or ROLLOUT_IDLE not in metrics:
            return None  # a step that trained nothing
        self._window.append((metrics[LEARNER_IDLE], metrics[ROLLOUT_IDLE]))
        if len(self._window) < self.cfg.window:
            return None
        learner_idle = sum(x for x, _ in self._window) / len(self._window)
        rollout_idle = sum(y for _, y in self._window) / len(self._window)
        self._window.pop(0)
        target = self._target(learner_idle, rollout_idle, workers)
        if target == workers:
            return None
        self.restart()
        self._asked = target
        figures = {"learner_idle_frac": learner_idle, "rollout_idle_frac": rollout_idle}
        return Decision(target, figures)

    def _target(self, learner_idle: float, rollout_idle: float, workers: int) -> int:
        cfg = self.cfg
        if learner_idle >= cfg.grow_learner_idle:
            return workers + 1 if workers < self.max_workers else workers
        if rollout_idle >= cfg.shrink_rollout_idle and learner_idle <= cfg.grow_learner_idle / 2:
            return workers - 1 if workers > cfg.min_workers else workers
        return workers
