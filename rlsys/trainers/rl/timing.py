"""Where an RL step's wall time goes (``StageTimer``: seconds per named stage, for the
``time/*`` metrics) and what keeps it from pausing (``setup_frozen``: the set-up out of the
cyclic garbage collector while the run trains)."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager


@contextmanager
def setup_frozen():
    """Keep what exists now (imported libraries, configs, the tokenizer: the set-up, alive to
    the end) out of the cyclic garbage collector while the run trains. A full collection over
    it took 130-140 ms in the controller's process on this project's 2-core machine, and a
    rollout loop waited through one mid-generation (``scripts/bench_step.py``). Garbage is
    collected first, and the set-up goes back to the collector at the end (with anything a
    caller froze before: ``gc.unfreeze`` has no nesting)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class StageTimer:
    """Wall seconds per named stage of one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        yield
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start
