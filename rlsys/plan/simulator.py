"""A discrete-event simulation of the pipeline (``rlsys.pipeline`` + the controller's step),
driven by the cost model and reply-length distributions.

What it models, each as the real code does it:

* the prompt feeder reserves groups from a real ``StreamingBuffer`` (the same admission
  control, staleness bound, filter accounting and sample budget: the simulator asks the buffer
  ``room()`` and ``ready()`` instead of blocking) and issues requests of
  ``Placement.per_request`` prompts;
* one rollout loop per worker takes requests first come, first served, through the gate; a
  call lasts ``StageCosts.generation_s`` of its prompts' drawn reply lengths; groups leave a
  request together, when its every sample is done;
* the scoring loop screens and queues groups one at a time (``score_group_s`` each);
* the learner takes a batch (``ready`` / ``take``), works (``step_overhead_s``, the
  log-probability pass when needed, ``ppo_epochs`` training passes; colocated engines sleep
  around it with the gate shut), then shuts the gate -- waiting for running calls, or aborting
  them with partial rollouts, whose samples go on under the new weights keeping the version
  of their first token -- bumps the version, syncs weights, reopens the gate and calls
  ``step_done``.

It reports what the run's metrics report, measured the same way: trained samples per second
of training wall time, the per-step idle fractions averaged over steps, the staleness
histogram of trained samples and the buffer's drops. The feeder's own time, evaluation and
checkpoints are left out.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.plan.cores import SharedCores
from rlsys.plan.costs import StageCosts
from rlsys.plan.workload import Placement, Workload
from rlsys.types import Completion, Prompt, RolloutGroup, Sample


@dataclass
class Prediction:
    """What a simulated run reports (the keys mirror ``summary.json`` and the metrics)."""

    samples_per_s: float  # trained samples / (simulated wall + run_overhead_s)
    trained_samples: int
    wall_s: float
    steps: int
    step_s: float  # mean learner step
    rollout_idle_frac: float  # per step, mean over steps (pool/rollout_idle_frac)
    learner_idle_frac: float  # per step, mean over steps (pool/learner_idle_frac)
    scoring_idle_frac: float
    staleness: dict[int, float]  # versions behind -> fraction of trained samples
    dropped: dict[str, int]  # reason -> samples
    steady_samples_per_s: float = 0.0  # after the first max_staleness + 1 steps (warm-up)
    samples_continued: int = 0  # partial rollouts
    gate_wait_s: float = 0.0  # mean per step (time/gate_wait)
    accounting_balanced: bool = True

    @property
    def staleness_mean(self) -> float:
        return sum(k * v for k, v in self.staleness.items())


@dataclass
class _Call:
    """One generation call running on a worker."""

    request: _Request
    start: float
    work: float  # seconds at full speed
    lengths: np.ndarray  # (S,) tokens this call generates per sequence
    version: int
    job: int = -1  # on the cores


@dataclass
class _Request:
    """Prompts issued together; ``todo`` is what each of its sequences still has to generate."""

    prompts: int
    todo: np.ndarray  # (prompts, n) tokens left per sample
    first_version: np.ndarray  # (prompts, n) version of each sample's first token; -1: none yet
    filtered: list[bool]  # per prompt: the filter will drop its group


@dataclass
class _Worker:
    call: _Call | None = None
    busy_s: float = 0.0  # generation seconds finished so far


@dataclass
class _Stats:
    step_marks: list[tuple[float, float, float]] = field(default_factory=list)  # t, gen, score
    rollout_idle: list[float] = field(default_factory=list)
    scoring_idle: list[float] = field(default_factory=list)
    learner_idle: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    step_ends: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)  # trained per step
    gate_wait: list[float] = field(default_factory=list)
    staleness: Counter = field(default_factory=Counter)
    continued: int = 0


class _SimGroup(RolloutGroup):
    """A group whose version (its oldest sample's) is computed once: the buffer reads it at
    every screen, step and take, and simulated samples never change."""

    def __init__(self, prompt: Prompt, samples: list[Sample]) -> None:
        super().__init__(prompt, samples)
        self._version = min(s.completion.version for s in samples)

    @property
    def version(self) -> int:
        return self._version


class Simulation:
    """One simulated run; ``run()`` returns its ``Prediction``. Deterministic for a seed."""

    def __init__(
        self, costs: StageCosts, workload: Workload, placement: Placement, seed: int = 0
    ) -> None:
        self.costs, self.work, self.place = costs, workload, placement
        self.rng = np.random.default_rng(seed)
        self.buffer = StreamingBuffer(
            workload.batch_size,
            workload.n_samples,
            placement.max_staleness,
            group_filter=self._keep,
            draw_rounds=workload.draw_rounds,
            max_groups=workload.max_groups,
            max_steps=workload.total_steps,
        )
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._requests: deque[_Request] = deque()
        self._workers = [_Worker() for _ in range(placement.rollout_workers)]
        self._scoring: deque[RolloutGroup] = deque()
        self._scoring_busy = False
        self._scoring_s = 0.0
        self._filtered: set[int] = set()  # ids of groups the filter drops
        self._gate_open = True
        self._gate_waiter: Callable[[], None] | None = None  # the learner, once calls return
        self._version = 0
        self._steps = 0
        self._step_start = 0.0
        self._waiting_since: float | None = None  # the learner waits for a batch
        self._done = False
        self._trained = 0  # samples the learner took
        self._samples: dict[int, Sample] = {}
        self.stats = _Stats()
        self.cores = SharedCores(lambda: self.now, self._at, costs.host_cores)

    # ---- the event loop --------------------------------------------------------------------

    def _at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (self.now + delay, next(self._seq), action))

    def run(self) -> Prediction:
        self.stats.step_marks.append((0.0, 0.0, 0.0))
        self._begin_step()
        self._feed()
        while self._events and not self._done:
            self.now, _, action = heapq.heappop(self._events)
            action()
        return self._prediction()

    # ---- the feeder and the rollout loops --------------------------------------------------

    def _keep(self, group: RolloutGroup) -> bool:
        return id(group) not in self._filtered

    def _feed(self) -> None:
        """Issue requests while the buffer grants reservations (the ``PromptFeeder``)."""
        per_request = self.place.per_request(self.work.batch_size)
        while self.buffer.room() > 0:
            granted = self.buffer.reserve(per_request)
            n = self.work.n_samples
            lengths = self.work.lengths.draw(self.rng, granted * n).reshape(granted, n)
            filtered = list(self.rng.random(granted) < self.work.filtered_frac)
            first = np.full((granted, n), -1, dtype=np.int64)
            self._requests.append(_Request(granted, lengths, first, filtered))
        self._dispatch()

    def _dispatch(self) -> None:
        """Idle workers start the oldest requests, if the gate is open."""
        for worker in self._workers:
            if not self._gate_open or not self._requests:
                return
            if worker.call is None:
                self._start_call(worker, self._requests.popleft())

    def _start_call(self, worker: _Worker, request: _Request) -> None:
        left = request.todo[request.todo > 0]
        prompts = int((request.todo > 0).any(axis=1).sum())
        duration = self.costs.generation_s(
            prompts, left.size, self.work.prompt_tokens, int(left.max()), int(left.sum())
        )
        call = _Call(request, self.now, duration, left, self._version)
        worker.call = call
        call.job = self.cores.start(duration, lambda: self._call_returns(worker, call, 0.0))

    def _abort(self, worker: _Worker) -> None:
        call = worker.call
        self._call_returns(worker, call, self.cores.stop(call.job))

    def _call_returns(self, worker: _Worker, call: _Call, left_s: float) -> None:
        """``call`` returned: finished, or aborted with ``left_s`` seconds of its work left."""
        worker.call = None
        worker.busy_s += self.now - call.start
        request = call.request
        running = request.todo > 0
        if left_s > 0:  # aborted (partial rollouts): each sequence got as far as the call
            progress = 1 - left_s / max(call.work, 1e-12)
            steps = int(progress * int(call.lengths.max()))
            made = np.minimum(request.todo, steps)
        else:
            made = request.todo.copy()
        started = running & (made > 0) & (request.first_version < 0)
        request.first_version[started] = call.version
        request.todo = request.todo - made
        if (request.todo > 0).any():  # aborted: goes on after the weight update, first in line
            self.stats.continued += int(((request.todo > 0) & running).sum())
            self._requests.appendleft(request)
        else:
            self._finish_request(request)
        self._gate_check()
        self._dispatch()

    def _finish_request(self, request: _Request) -> None:
        for row, filtered in zip(request.first_version.tolist(), request.filtered, strict=True):
            group = _SimGroup(_PROMPT, [self._sample(v) for v in row])
            if filtered:
                self._filtered.add(id(group))
            self._scoring.append(group)
        self._score_next()

    def _sample(self, version: int) -> Sample:
        """A stand-in sample generated at ``version`` (the buffer reads only versions)."""
        if version not in self._samples:
            completion = Completion([0], [0.0], "stop", version)
            self._samples[version] = Sample(_PROMPT, [0], completion, "")
        return self._samples[version]

    # ---- the scoring loop ------------------------------------------------------------------

    def _score_next(self) -> None:
        if self._scoring_busy or not self._scoring:
            return
        self._scoring_busy = True
        group = self._scoring.popleft()
        start = self.now
        self.cores.start(self.costs.score_group_s, lambda: self._scored(group, start))

    def _scored(self, group: RolloutGroup, start: float) -> None:
        self._scoring_busy = False
        self._scoring_s += self.now - start
        self.buffer.put(group)
        self._filtered.discard(id(group))
        self._score_next()
        self._feed()  # a dropped group frees its slot
        self._learner_check()

    # ---- the gate --------------------------------------------------------------------------

    def _shut_gate(self, then: Callable[[], None]) -> None:
        """Shut the gate; ``then`` runs once no call is running (at once with partial
        rollouts: running calls are aborted)."""
        self._gate_open = False
        self._gate_waiter = then
        if self.place.partial:
            for worker in self._workers:
                if worker.call is not None:
                    self._abort(worker)
        self._gate_check()

    def _gate_check(self) -> None:
        if self._gate_waiter is not None and all(w.call is None for w in self._workers):
            waiter, self._gate_waiter = self._gate_waiter, None
            waiter()

    def _open_gate(self) -> None:
        self._gate_open = True
        self._dispatch()

    # ---- the learner -----------------------------------------------------------------------

    def _begin_step(self) -> None:
        self._step_start = self.now
        self._waiting_since = self.now
        self._learner_check()

    def _learner_check(self) -> None:
        if self._waiting_since is None or not self.buffer.ready(self.work.batch_size):
            return
        waited = self.now - self._waiting_since
        self._waiting_since = None
        kept = self.buffer.take(self.work.batch_size)
        if not kept and self.buffer.exhausted():
            self._done = True
            return
        self._mark_pools()
        for group in kept:
            self.stats.staleness[self._version - group.version] += len(group.samples)
        self._trained += sum(len(g.samples) for g in kept)
        self.stats.step_samples.append(sum(len(g.samples) for g in kept))
        work = self._learner_work(len(kept) * self.work.n_samples) if kept else 0.0
        self.cores.start(self.costs.step_overhead_s, lambda: self._learn(work, bool(kept), waited))

    def _learner_work(self, samples: int) -> float:
        ranks, tokens = self.place.learner_ranks, self._tokens(samples)
        seconds = self.costs.train_s(
            samples, tokens, ranks, self.work.ppo_epochs, self.work.mini_batches
        )
        if self.work.needs_logprobs:
            seconds += self.costs.logprobs_s(samples, tokens, ranks)
        return seconds

    def _tokens(self, samples: int) -> float:
        return samples * (self.work.prompt_tokens + self.work.lengths.mean)

    def _learn(self, work: float, moved: bool, waited: float) -> None:
        if not moved:
            self._publish(False, waited)
            return
        if not self.place.colocated:
            self.cores.start(work, lambda: self._publish(True, waited))
            return
        # colocated: the engines sleep through the learner's work (gate shut around it)
        asleep = self.costs.engine_sleep_s + work + self.costs.engine_wake_s

        def sleep_and_train() -> None:
            self.cores.start(asleep, lambda: (self._open_gate(), self._publish(True, waited)))

        self._shut_gate(sleep_and_train)

    def _publish(self, moved: bool, waited: float) -> None:
        if not moved:
            self._end_step(waited, 0.0)
            return
        shut_at = self.now

        def sync() -> None:
            gate_wait = self.now - shut_at
            self._version += 1
            self.cores.start(
                self.costs.weight_sync_s(self.work.weight_bytes),
                lambda: self._synced(waited, gate_wait),
            )

        self._shut_gate(sync)

    def _synced(self, waited: float, gate_wait: float) -> None:
        self._open_gate()
        self._end_step(waited, gate_wait)

    def _end_step(self, waited: float, gate_wait: float) -> None:
        self.buffer.step_done(self._version)
        step_s = self.now - self._step_start
        self.stats.step_s.append(step_s)
        self.stats.step_ends.append(self.now)
        self.stats.learner_idle.append(waited / step_s if step_s > 0 else 0.0)
        self.stats.gate_wait.append(gate_wait)
        self._steps += 1
        if self._steps >= self.work.total_steps:
            self._done = True
            return
        self._feed()
        self.cores.start(self.costs.between_steps_s, self._begin_step)

    def _mark_pools(self) -> None:
        """Busy and idle time since the previous step's mark (``Pipeline.pool_metrics``)."""
        # a running call's time counts once it returns, as the real loops' busy clocks do
        done = sum(w.busy_s for w in self._workers) / len(self._workers)
        then, gen_before, score_before = self.stats.step_marks[-1]
        wall = max(self.now - then, 1e-9)
        self.stats.rollout_idle.append(_clip01(1 - (done - gen_before) / wall))
        self.stats.scoring_idle.append(_clip01(1 - (self._scoring_s - score_before) / wall))
        self.stats.step_marks.append((self.now, done, self._scoring_s))

    # ---- the result ------------------------------------------------------------------------

    def _prediction(self) -> Prediction:
        wall = self.now + self.costs.run_overhead_s
        trained = self._trained
        total = sum(self.stats.staleness.values())
        self.buffer.close()
        self.buffer.drop_queued("unused")
        accounting = self.buffer.accounting()
        dropped = dict(accounting["samples_dropped"])
        dropped["unused"] += accounting["samples_in_flight"]
        return Prediction(
            samples_per_s=trained / wall if wall > 0 else 0.0,
            trained_samples=trained,
            wall_s=wall,
            steps=self._steps,
            step_s=_mean(self.stats.step_s),
            rollout_idle_frac=_mean(self.stats.rollout_idle),
            learner_idle_frac=_mean(self.stats.learner_idle),
            scoring_idle_frac=_mean(self.stats.scoring_idle),
            staleness={k: v / total for k, v in sorted(self.stats.staleness.items())},
            dropped=dropped,
            steady_samples_per_s=self._steady(),
            samples_continued=self.stats.continued,
            gate_wait_s=_mean(self.stats.gate_wait),
            accounting_balanced=accounting["samples_issued"]
            == accounting["samples_trained"] + sum(dropped.values()),
        )

    def _steady(self) -> float:
        """Samples/s once the pipeline is full: the steps after the first
        ``max_staleness + 1`` (fewer if the run is short; all of them for one step)."""
        ends, samples = self.stats.step_ends, self.stats.step_samples[: len(self.stats.step_ends)]
        if not ends:
            return 0.0
        warm = min(self.place.max_staleness + 1, len(ends) - 1)
        start = ends[warm - 1] if warm else 0.0
        span = ends[-1] - start
        return sum(samples[warm:]) / span if span > 0 else 0.0


_PROMPT = Prompt(0, "", "")


def simulate(
    costs: StageCosts, workload: Workload, placement: Placement, seed: int = 0
) -> Prediction:
    """Simulate one run of ``workload`` on ``placement`` with ``costs``."""
    return Simulation(costs, workload, placement, seed).run()


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else 0.0


def _clip01(x: float) -> float:
    return min(max(x, 0.0), 1.0)
