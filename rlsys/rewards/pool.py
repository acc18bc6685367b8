"""Rule-based rewards on a pool of reward worker actors (``reward.num_workers`` > 0).

Items are scored in batches of ``reward.batch_size`` spread over the workers. A batch that
does not come back in time (a reward function stuck in C code, a worker that died) scores 0
with one error per item, and its worker is replaced, so scoring never stalls or crashes the
run. Reward models have their own actors (``rlsys.rewards.model``: inference-only learner
groups).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading

import ray

from rlsys.config.reward import RewardConfig
from rlsys.placement.resources import ActorResources
from rlsys.rewards.scorer import Item, RewardScorer
from rlsys.rewards.scoring import RewardOutcome

log = logging.getLogger(__name__)
CONCURRENCY = 8  # reward calls at once inside one worker
START_TIMEOUT_S = 300.0  # a replacement worker must be up within this


@ray.remote
class RewardWorker:
    """Scores batches with the run's rule-based rewards (built in this process)."""

    def __init__(self, task_reward: str, cfg: RewardConfig, threads: int) -> None:
        from rlsys.runtime import limit_threads, quiet_libraries

        quiet_libraries()
        limit_threads(threads)
        self.scorer = RewardScorer.from_config(task_reward, cfg)

    def score(self, items: list[Item]) -> list[RewardOutcome]:
        return self.scorer.score(items)

    def ready(self) -> bool:
        return True


class RewardPool:
    """``reward.num_workers`` reward workers behind one ``score(items)``."""

    def __init__(self, task_reward: str, cfg: RewardConfig, resources: ActorResources) -> None:
        self.task_reward, self.cfg, self.resources = task_reward, cfg, resources
        self.workers = [self._spawn() for _ in range(cfg.num_workers)]
        try:
            ray.get([w.ready.remote() for w in self.workers], timeout=START_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self._next = 0  # round robin over calls: one-batch calls still spread
        self._lock = threading.Lock()  # scoring and eval may score at once
        self.replaced = 0  # workers replaced after a batch timed out or a worker died
        # a batch runs ceil(batch / CONCURRENCY) rounds of calls, each up to timeout_s
        self.batch_timeout_s = cfg.timeout_s * math.ceil(cfg.batch_size / CONCURRENCY) + 30.0

    def _spawn(self) -> ray.actor.ActorHandle:
        return RewardWorker.options(**self.resources.actor_options()).remote(
            self.task_reward, self.cfg, self.resources.threads
        )

    def score(self, items: list[Item]) -> list[RewardOutcome]:
        """One outcome per item; never raises."""
        with self._lock:
            return self._score(items)

    def _score(self, items: list[Item]) -> list[RewardOutcome]:
        size = self.cfg.batch_size
        batches = [items[i : i + size] for i in range(0, len(items), size)]
        refs = []
        for batch in batches:
            worker = self._next % len(self.workers)
            self._next += 1
            refs.append((worker, self.workers[worker].score.remote(batch)))
        out: list[RewardOutcome] = []
        replaced: set[int] = set()  # a replaced worker's other batches are lost with it
        for (worker, ref), batch in zip(refs, batches, strict=True):
            try:
                out.extend(ray.get(ref, timeout=self.batch_timeout_s))
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
                why = f"reward worker {worker}: {type(exc).__name__}"
                out.extend(RewardOutcome(0.0, False, why, errors=1) for _ in batch)
                if worker not in replaced:
                    log.warning("%s; its batches score 0, replacing it", why)
                    self._replace(worker)
                    replaced.add(worker)
        return out

    def _replace(self, worker: int) -> None:
        """A fresh worker in slot ``worker``; one that does not start is left there and
        replaced again when its next batch fails."""
        with contextlib.suppress(Exception):
            ray.kill(self.workers[worker])
        self.workers[worker] = self._spawn()
        self.replaced += 1
        try:
            ray.get(self.workers[worker].ready.remote(), timeout=START_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - scoring must go on
            log.warning("replacement reward worker %d did not start: %r", worker, exc)

    def shutdown(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(w)
