"""Colocated engines and learners taking turns on the devices' memory, step by step.

While the learners train, the engines sleep (weights off the device, KV cache dropped). After
the update the learner-side groups hand back the memory their allocators cache but do not use,
so an engine waking into it finds it free; the engines then take their weights back, the new
weights arrive by sync, and only then does the KV cache return, so the sync never competes with
it for memory (vLLM's staged wake; the order verl and OpenRLHF use). The rollout loops stay held
from the sleep to the last stage. Each stage reports ``memory/*`` metrics (docs/metrics.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

from rlsys.engines.base import WAKE_ALL

if TYPE_CHECKING:
    from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


class MemoryHandover:
    """The sleep / hand-over / staged wake of one run (``enabled``: ``cfg.engines_sleep``);
    ``state.pipeline.gate`` holds the rollout loops (read at each use: recovery replaces the
    pipeline)."""

    def __init__(self, pools: Pools, state, enabled: bool) -> None:
        self.pools, self.state, self.enabled = pools, state, enabled
        self.kv_cache_asleep = False  # the weights woke for a sync, the KV cache not yet

    def held(self):
        """Hold the rollout loops for a whole step when engines sleep (a no-op otherwise)."""
        return self.state.pipeline.gate.shut() if self.enabled else nullcontext()

    @contextmanager
    def engines_asleep(self, timer, metrics: dict[str, float]) -> Iterator[None]:
        """The engines sleep for the block; after it the learner-side groups release their
        cached memory and the engines wake their weights (the version they had), ready for
        the sync. If the block fails (a rank died), the engines wake whole at once, so
        whatever recovers the run finds them ready to generate. Without ``enabled`` the
        block just runs."""
        if not self.enabled:
            yield
            return
        with self.state.pipeline.gate.shut():
            with timer("engine_sleep"):
                slept = self.pools.rollout.sleep()
            metrics["rollout/engines_slept"] = float(len(slept))
            metrics["memory/engine_freed_bytes"] = sum(r["freed_bytes"] for r in slept)
            drops = [r["rss_drop_bytes"] for r in slept if r["rss_drop_bytes"] is not None]
            if drops:
                metrics["memory/engine_rss_drop_bytes"] = float(sum(drops))
            try:
                yield
            except BaseException:
                self.wake_all()
                raise
            with timer("engine_wake"):
                metrics.update(self._release())
                woken = self.pools.rollout.wake(("weights",))
            self.kv_cache_asleep = True
            metrics["rollout/engines_woken"] = float(len(woken))
            metrics.update(_taken("memory/engine_wake_bytes", woken))

    def _release(self) -> dict[str, float]:
        """The learner-side groups' release, best effort: a rank that cannot answer holds
        nothing the engines need back (its process is gone or going)."""
        try:
            return self.pools.release_memory()
        except Exception as exc:  # noqa: BLE001 - the wake must happen regardless
            log.warning("releasing learner memory before the engines wake failed: %s", exc)
            return {}

    def wake_all(self) -> None:
        """Wake the engines whole (weights and KV cache), best effort: after a failed step,
        before the run recovers."""
        try:
            self.pools.rollout.wake(WAKE_ALL)
        except Exception as exc:  # noqa: BLE001 - recovery replaces engines that cannot
            log.warning("waking the engines after a failed step failed: %s", exc)
        self.kv_cache_asleep = False

    def wake_kv_cache(self, timer) -> dict[str, float]:
        """The engines' KV cache back, after the weight sync."""
        if not self.kv_cache_asleep:
            return {}
        with timer("engine_wake_kv"):
            woken = self.pools.rollout.wake(("kv_cache",))
        self.kv_cache_asleep = False
        return _taken("memory/engine_kv_wake_bytes", woken)


def _taken(key: str, woken: list[dict[str, float]]) -> dict[str, float]:
    """``{key: memory the wakes took, summed}`` where every worker could measure it."""
    taken = [w["taken_bytes"] for w in woken]
    if not taken or any(t is None for t in taken):
        return {}
    return {key: float(sum(taken))}
