"""The loops of a run, wired by queues and the buffer, started and stopped as one."""

from __future__ import annotations

import logging
import math
import queue
import threading
import time

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.data.sampler import PromptSampler
from rlsys.pipeline.feeder import PromptFeeder
from rlsys.pipeline.gate import RolloutGate
from rlsys.pipeline.rollout import RolloutLoop
from rlsys.pipeline.scoring import ScoringLoop
from rlsys.pipeline.sides import RolloutSide, ScoringSide

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
        rollout: RolloutSide,
        scoring: ScoringSide,
    ) -> None:
        self.buffer = buffer
        self.gate = RolloutGate(rollout.abort, rollout.partial)
        self.error: BaseException | None = None
        self._error_lock = threading.Lock()
        self._requests: queue.Queue = queue.Queue()
        self._groups: queue.Queue = queue.Queue()
        self._prompts_per_request = rollout.prompts_per_request
        self._batch_size = buffer.batch_size
        self.feeder = PromptFeeder(
            buffer,
            sampler,
            rollout.encode,
            self._requests,
            self._per_request(rollout.num_workers),
            self.fail,
        )

        def new_loop(worker: int) -> RolloutLoop:
            return RolloutLoop(
                worker,
                rollout.generate_on,
                rollout.build_groups,
                self.gate,
                buffer,
                self._requests,
                self._groups,
                rollout.sampling,
                rollout.seed + worker * 1_000_003,
                rollout.greedy_baseline,
                rollout.partial,
                self.fail,
                rollout.replace_worker,
                rollout.episodes,
                rollout.tree,
                rollout.end_ids,
            )

        self._new_loop = new_loop
        self.rollouts = [new_loop(worker) for worker in range(rollout.num_workers)]  # active
        self._retiring: list[RolloutLoop] = []  # finishing their request, then ending
        self._every_rollout = list(self.rollouts)  # for busy time and joins
        self._calls_of_retired: dict[int, int] = {}  # a re-added worker goes on with its seeds
        self.scoring = ScoringLoop(
            self._groups,
            buffer,
            scoring.score,
            scoring.shape,
            scoring.reference,
            scoring.pad_id,
            lambda: len(self._every_rollout),
            self.fail,
            scoring.replay,
        )
        self.replay = scoring.replay
        self._started = False
        self._mark = (time.perf_counter(), self._busy())
        self._worker_mark: dict[int, float] = {}  # busy seconds per rollout worker, last call

    def _per_request(self, workers: int) -> int:
        return self._prompts_per_request or math.ceil(self._batch_size / workers)

    @property
    def _loops(self) -> list:
        return [self.feeder, *self._every_rollout, self.scoring]

    def start(self) -> None:
        for loop in self._loops:
            loop.start()
        self._started = True
        self._mark = (time.perf_counter(), self._busy())

    # ---- resizing the rollout pool (between learner steps, on the learner's thread) ------

    def add_rollout(self, worker: int) -> None:
        """Start a rollout loop for the new worker ``worker`` (it must hold the current
        weights already). Counted before it starts, so scoring waits for its end too."""
        loop = self._new_loop(worker)
        loop.calls = self._calls_of_retired.pop(worker, 0)
        self._every_rollout.append(loop)
        self.rollouts.append(loop)
        self.feeder.per_request = self._per_request(len(self.rollouts))
        if self._started:
            loop.start()

    def retire_rollouts(self, count: int) -> list[int]:
        """Retire the loops of the last ``count`` workers: each finishes the request it holds
        (its groups are scored and trained as usual), then ends. Returns their workers."""
        if not 0 < count < len(self.rollouts):
            raise ValueError(f"cannot retire {count} of {len(self.rollouts)} rollout loops")
        leaving, self.rollouts = self.rollouts[-count:], self.rollouts[:-count]
        for loop in leaving:
            loop.retiring.set()
        self._retiring.extend(leaving)
        self.feeder.per_request = self._per_request(len(self.rollouts))
        return [loop.worker for loop in leaving]

    def retired(self) -> list[int] | None:
        """The workers whose retired loops have all ended (their engines may go), or None
        while any is still finishing a request."""
        if any(not loop.join(0) for loop in self._retiring):
            return None
        workers = [loop.worker for loop in self._retiring]
        for loop in self._retiring:
            self._calls_of_retired[loop.worker] = loop.calls
        self._retiring = []
        return workers

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
        """The loops' counters and the replay store (the sampler and buffer are checkpointed
        by their owners)."""
        state = {
            "drawn": self.feeder.drawn,
            "calls": [loop.calls for loop in self.rollouts],
            "continued": [loop.continued for loop in self.rollouts],
        }
        if self.replay is not None:
            state["replay"] = self.replay.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        """Counters of a checkpoint (before ``start``); a different worker count keeps them
        for the workers both have."""
        self.feeder.drawn = state["drawn"]
        for loop, calls, continued in zip(
            self.rollouts, state["calls"], state["continued"], strict=False
        ):  # a checkpoint's loops, or as many as the pool has
            loop.calls, loop.continued = calls, continued
        if self.replay is not None and "replay" in state:  # else replay starts empty here
            self.replay.load_state_dict(state["replay"])

    # ---- metrics -----------------------------------------------------------------------

    def _busy(self) -> dict[str, float]:
        return {
            "rollout": sum(loop.read_busy() for loop in self._every_rollout),
            "decode_steps": sum(loop.decode_steps for loop in self._every_rollout),
            "scoring": self.scoring.read_busy(),
        }

    def pool_metrics(self) -> dict[str, float]:
        """Since the previous call: seconds busy generating (mean over rollout workers) and
        scoring, decode steps (``RolloutLoop.decode_steps``), and each pool's idle fraction."""
        now, busy = time.perf_counter(), self._busy()
        then, before = self._mark
        self._mark = (now, busy)
        wall = max(now - then, 1e-9)
        generation = (busy["rollout"] - before["rollout"]) / len(self.rollouts)
        scoring = busy["scoring"] - before["scoring"]
        return {
            "time/generation": generation,
            # summed over workers (each reads its own weights): perf/decode_bw_frac
            "rollout/decode_steps": busy["decode_steps"] - before["decode_steps"],
            "time/scoring": scoring,
            "pool/rollout_idle_frac": _clip01(1 - generation / wall),
            "pool/scoring_idle_frac": _clip01(1 - scoring / wall),
            **self._worker_metrics(),
        }

    def _worker_metrics(self) -> dict[str, float]:
        """``time/rollout_worker_<i>``: seconds each active rollout worker spent generating
        since the previous call (a slow or starved worker stands out)."""
        busy: dict[int, float] = {}
        for loop in self._every_rollout:  # a re-added worker's loops add up
            busy[loop.worker] = busy.get(loop.worker, 0.0) + loop.read_busy()
        before, self._worker_mark = self._worker_mark, busy
        return {
            f"time/rollout_worker_{loop.worker}": busy[loop.worker] - before.get(loop.worker, 0.0)
            for loop in self.rollouts
        }

    @property
    def prompts_drawn(self) -> int:
        return self.feeder.drawn

    @property
    def samples_continued(self) -> int:
        """Samples a weight update interrupted and that went on under the new weights."""
        return sum(loop.continued for loop in self._every_rollout)


def _clip01(x: float) -> float:
    return min(max(x, 0.0), 1.0)
