"""The scoring loop: rewards, the buffer's screen, reward shaping and reference log-probs,
group by group as rollouts finish."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from rlsys.buffer.replay import ReplayStore
from rlsys.buffer.streaming import StreamingBuffer
from rlsys.data.collate import samples_to_batch
from rlsys.pipeline.loop import Loop
from rlsys.types import RolloutGroup, Sample, TrainBatch


class ScoringLoop(Loop):
    """Consumes: complete groups from the rollout loops. Produces: scored groups in the
    buffer (or drops counted there). Waits for: a group; the reference group. Unblocked by:
    any rollout loop finishing a request. Ends when every rollout loop started so far
    (``producers()``, which grows as the pool does) has sent its ``None``.

    Order per group: the reward function (and ReMax's greedy reply), the replay store's offer
    and fill (``buffer.replay``), the buffer's staleness and filter screen on the verifier's
    rewards, ``shape`` (overlong penalty), then for kept groups only the reference policy's
    log-probabilities and the queue."""

    name = "scoring"

    def __init__(
        self,
        groups: queue.Queue,
        buffer: StreamingBuffer,
        score: Callable[[list[RolloutGroup]], None],
        shape: Callable[[list[Sample]], float],
        reference: Callable[[TrainBatch], np.ndarray] | None,
        pad_id: int,
        producers: Callable[[], int],
        on_failure,
        replay: ReplayStore | None = None,
    ) -> None:
        super().__init__(on_failure)
        self.groups, self.buffer, self.replay = groups, buffer, replay
        self.score, self.shape, self.reference = score, shape, reference
        self.pad_id, self.producers = pad_id, producers
        self.stopping = threading.Event()  # the run is ending: count arrivals as unused
        self._window: list[RolloutGroup] = []  # scored since the last drain
        self._penalties: list[float] = []
        self._reference_s = 0.0
        self._window_lock = threading.Lock()

    def run(self) -> None:
        ended = 0
        while ended < self.producers():
            group = self.groups.get()
            if group is None:
                ended += 1
                continue
            if self.stopping.is_set():
                self.buffer.cancel(1, "unused")
                continue
            try:
                with self.busy():
                    self._process(group)
            except BaseException:
                self.buffer.cancel(1, "failed")
                raise

    def _process(self, group: RolloutGroup) -> None:
        self.score([group])
        if group.baseline is not None:
            self.score([RolloutGroup(group.prompt, [group.baseline])])
        trained = group  # what goes to the learner: with replayed successes in an all-wrong one
        if self.replay is not None:
            self.replay.offer(group)
            trained = self.replay.fill(group)
        kept = self.buffer.screen(trained)  # on the verifier's rewards
        extra = [group.baseline] if group.baseline is not None else []
        penalty = self.shape(group.samples + extra)
        if trained is not group:
            self.shape([s for s in trained.samples if s.replayed])
        with self._window_lock:
            self._window.append(group)  # as generated: the metrics and curriculum see that
            self._penalties.append(penalty)
        if not kept:
            return
        # a screened group is still in flight: a failure below is cancelled as "failed"
        if self.reference is not None:
            start = time.perf_counter()
            self._add_reference(trained)
            with self._window_lock:
                self._reference_s += time.perf_counter() - start
        self.buffer.push(trained)

    def _add_reference(self, group: RolloutGroup) -> None:
        batch = samples_to_batch(group.samples, self.pad_id)
        ref = self.reference(batch)
        for sample, row, mask in zip(group.samples, ref, batch.loss_mask, strict=True):
            sample.ref_logprobs = np.asarray(row[mask > 0], dtype=np.float32)

    def drain_window(self) -> tuple[list[RolloutGroup], list[float], float]:
        """Since the last call: the groups scored (kept or not), their mean overlong
        penalties and the seconds spent on reference log-probabilities."""
        with self._window_lock:
            out = self._window, self._penalties, self._reference_s
            self._window, self._penalties, self._reference_s = [], [], 0.0
            return out
