"""The loops of a run, wired by queues and the buffer, started and stopped as one."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from rlsys.buffer import StreamingBuffer
from rlsys.data.sampler import PromptSampler
from rlsys.pipeline.feeder import PromptFeeder
from rlsys.pipeline.gate import RolloutGate
from rlsys.pipeline.rollout import BuildGroups, GenerateOn, ReplaceWorker, RolloutLoop
from rlsys.pipeline.scoring import ScoringLoop
from rlsys.types import Prompt, RolloutGroup, Sample, SamplingParams, TrainBatch

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 120.0  # how long stop() waits for the loops before giving up on them


class Pipeline:
    """Prompt feeder -> one rollout loop per worker -> scoring -> ``buffer``; the learner
    (the controller's thread) takes batches from the buffer and shuts ``gate`` to update the
    engines' weights. A loop that fails stops the others; ``raise_if_failed`` re-raises it
    on the learner's thread."""

    def __init__(
        self,
        buffer: StreamingBuffer,
        sampler: PromptSampler,
        encode: Callable[[list[Prompt]], tuple[list[Prompt], list[list[int]]]],
        build_groups: BuildGroups,
        score: Callable[[list[RolloutGroup]], None],
        shape: Callable[[list[Sample]], float],
        generate_on: GenerateOn,
        abort: Callable[[], None],
        num_workers: int,
        sampling: SamplingParams,
        *,
        prompts_per_request: int | None = None,
        seed: int = 0,
        greedy_baseline: bool = False,
        partial: bool = False,
        reference: Callable[[TrainBatch], np.ndarray] | None = None,
        pad_id: int = 0,
        replace_worker: ReplaceWorker | None = None,
    ) -> None:
        self.buffer = buffer
        self.gate = RolloutGate(abort, partial)
        self.error: BaseException | None = None
        self._error_lock = threading.Lock()
        requests: queue.Queue = queue.Queue()
        groups: queue.Queue = queue.Queue()
        per_request = prompts_per_request or math.ceil(buffer.batch_size / num_workers)
        self.feeder = PromptFeeder(
            buffer, sampler, encode, requests, per_request, num_workers, self.fail
        )
        self.rollouts = [
            RolloutLoop(
                worker,
                generate_on,
                build_groups,
                self.gate,
                buffer,
                requests,
                groups,
                sampling,
                seed + worker * 1_000_003,
                greedy_baseline,
                partial,
                self.fail,
                replace_worker,
            )
            for worker in range(num_workers)
        ]
        self.scoring = ScoringLoop(
            groups, buffer, score, shape, reference, pad_id, num_workers, self.fail
        )
        self._loops = [self.feeder, *self.rollouts, self.scoring]
        self._mark = (time.perf_counter(), self._busy())

    def start(self) -> None:
        for loop in self._loops:
            loop.start()
        self._mark = (time.perf_counter(), self._busy())

    def fail(self, exc: BaseException) -> None:
        """A loop failed: remember the first error and stop every loop."""
        with self._error_lock:
            if self.error is None:
                self.error = exc
        self.buffer.close()
        self.scoring.stopping.set()
        self.gate.stop()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"a pipeline loop failed: {self.error!r}") from self.error

    def stop(self) -> None:
        """End the run: no new prompts, running requests aborted, whatever is in flight or
        queued counted as unused. Waits for every loop."""
        self.buffer.close()
        self.scoring.stopping.set()
        self.gate.stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for loop in self._loops:
            while not loop.join(1.0):
                if time.monotonic() > deadline:
                    log.error("%s did not stop within %.0f s", loop.name, STOP_TIMEOUT_S)
                    break
                self.gate.abort()  # an abort can miss a request that was just starting
        self.buffer.drop_queued("unused")

    # ---- checkpoints -----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The loops' counters (the sampler and buffer are checkpointed by their owners)."""
        return {
            "drawn": self.feeder.drawn,
            "calls": [loop.calls for loop in self.rollouts],
            "continued": [loop.continued for loop in self.rollouts],
        }

    def load_state_dict(self, state: dict) -> None:
        """Counters of a checkpoint (before ``start``); a different worker count keeps them
        for the workers both have."""
        self.feeder.drawn = state["drawn"]
        for loop, calls, continued in zip(
            self.rollouts, state["calls"], state["continued"], strict=False
        ):
            loop.calls, loop.continued = calls, continued

    # ---- metrics -----------------------------------------------------------------------

    def _busy(self) -> dict[str, float]:
        return {
            "rollout": sum(loop.read_busy() for loop in self.rollouts),
            "scoring": self.scoring.read_busy(),
        }

    def pool_metrics(self) -> dict[str, float]:
        """Since the previous call: seconds busy generating (mean over rollout workers) and
        scoring, and each pool's idle fraction."""
        now, busy = time.perf_counter(), self._busy()
        then, before = self._mark
        self._mark = (now, busy)
        wall = max(now - then, 1e-9)
        generation = (busy["rollout"] - before["rollout"]) / len(self.rollouts)
        scoring = busy["scoring"] - before["scoring"]
        return {
            "time/generation": generation,
            "time/scoring": scoring,
            "pool/rollout_idle_frac": _clip01(1 - generation / wall),
            "pool/scoring_idle_frac": _clip01(1 - scoring / wall),
        }

    @property
    def prompts_drawn(self) -> int:
        return self.feeder.drawn

    @property
    def samples_continued(self) -> int:
        """Samples a weight update interrupted and that went on under the new weights."""
        return sum(loop.continued for loop in self.rollouts)


def _clip01(x: float) -> float:
    return min(max(x, 0.0), 1.0)
