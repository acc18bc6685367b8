"""One rollout loop per rollout worker: requests in, complete unscored groups out."""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Callable

import numpy as np

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.config.tree import TreeConfig
from rlsys.envs.rollout import EpisodeRunner
from rlsys.pipeline.feeder import Request
from rlsys.pipeline.gate import RolloutGate
from rlsys.pipeline.iid_tree import sample_iid_tree
from rlsys.pipeline.loop import Loop
from rlsys.pipeline.tree import sample_tree
from rlsys.types import Completion, Prompt, RolloutGroup, SamplingParams, pixels_of

# (worker, prompt ids, sampling, seed, per-prompt token budgets[, per-prompt images]) ->
# completions per prompt (the images only when a prompt has some)
GenerateOn = Callable[
    [int, list[list[int]], SamplingParams, int | None, list[int] | None, list | None],
    list[list[Completion]],
]
# (worker, its error) -> whether the worker was replaced (then the call is retried)
ReplaceWorker = Callable[[int, BaseException], bool]
BuildGroups = Callable[
    [list[Prompt], list[list[int]], list[list[Completion]], list[Completion] | None],
    list[RolloutGroup],
]


RETIRE_POLL_S = 0.2  # how often a loop waiting for a request checks whether it retires


class RolloutLoop(Loop):
    """Consumes: ``Request``s from the feeder. Produces: complete groups (every sample
    finished) on ``groups`` for scoring, then one ``None`` when it ends (at the end of the run,
    or retired when the pool shrinks). Waits for: a request, the gate to open (a weight update
    in progress), its worker's generation. Unblocked by: the feeder, the learner re-opening
    the gate.

    With ``partial`` rollouts, samples a weight update aborted are continued from their prefix
    under the new weights (each token keeps the version that produced it). Without, requests
    only end aborted when the run stops. ``greedy_baseline`` (ReMax) adds one greedy reply
    per prompt. With ``episodes`` (a multi-turn task) every sample is a trajectory: model
    turns alternate with the environment's observations, one generation call per turn for
    the trajectories still going. With ``tree`` (tree rollouts) a group's samples are the
    leaves of a tree of shared segments, one generation call per level (``sample_tree``).
    A generation call that fails is retried once
    ``replace_worker`` reports the worker replaced (a dead process restarted with the current
    weights); the request keeps its reservation, so its prompts are neither lost nor counted
    twice."""

    def __init__(
        self,
        worker: int,
        generate_on: GenerateOn,
        build_groups: BuildGroups,
        gate: RolloutGate,
        buffer: StreamingBuffer,
        requests: queue.Queue,
        groups: queue.Queue,
        sampling: SamplingParams,
        seed: int,
        greedy_baseline: bool,
        partial: bool,
        on_failure,
        replace_worker: ReplaceWorker | None = None,
        episodes: EpisodeRunner | None = None,
        tree: TreeConfig | None = None,
        end_ids: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__(on_failure)
        self.name = f"rollout-{worker}"
        self.worker, self.generate_on, self.build_groups = worker, generate_on, build_groups
        self.gate, self.buffer = gate, buffer
        self.requests, self.groups = requests, groups
        self.sampling, self.seed = sampling, seed
        self.greedy_baseline, self.partial = greedy_baseline, partial
        self.replace_worker = replace_worker
        self.episodes = episodes
        self.tree = tree
        self.end_ids = end_ids  # tokens that end a reply (EOS, rollout.stop_token_ids)
        self.calls = 0  # generation calls made (each gets its own seed)
        self.continued = 0  # samples continued after an abort
        # decode steps at least: each call's longest reply (a batch decodes a token a step)
        self.decode_steps = 0
        self.retiring = threading.Event()  # set: finish the current request, then end

    def run(self) -> None:
        try:
            while (request := self._next_request()) is not None:
                try:
                    groups = self._rollout(request)
                except BaseException:
                    self.buffer.cancel(len(request.prompts), "failed")
                    raise
                if groups is None:  # the run is ending
                    self.buffer.cancel(len(request.prompts), "unused")
                    continue
                for group in groups:
                    self.groups.put(group)
        finally:
            self.groups.put(None)

    def _next_request(self) -> Request | None:
        """The next request; None at the end of the run (passed on to the other loops) or
        once this loop is ``retiring`` (it ends between requests, so none is lost)."""
        while not self.retiring.is_set():
            try:
                request = self.requests.get(timeout=RETIRE_POLL_S)
            except queue.Empty:
                continue
            if request is None:
                self.requests.put(None)  # one end marker for every loop
            return request
        return None

    def _rollout(self, request: Request) -> list[RolloutGroup] | None:
        completions = self._generate(request, self.sampling)
        if completions is None:
            return None
        baseline = None
        if self.greedy_baseline:
            greedy = dataclasses.replace(self.sampling, n=1, greedy=True)
            replies = self._generate(request, greedy)
            if replies is None:
                return None
            baseline = [r[0] for r in replies]
        return self.build_groups(request.prompts, request.prompt_ids, completions, baseline)

    def _generate(
        self, request: Request, sampling: SamplingParams
    ) -> list[list[Completion]] | None:
        """Finished completions (multi-turn: trajectories) per prompt of ``request``."""
        images = pixels_of(request.prompts)
        if images is not None and (self.episodes is not None or self.tree is not None):
            raise ValueError(
                "prompts with images take flat single-turn rollouts; set rollout.tree.enabled="
                "false and task.env.name=null"
            )
        if self.episodes is None and self.tree is not None and sampling.n > 1:
            if self.tree.mode == "iid":
                uniform = np.random.default_rng([self.seed, self.calls]).random
                ends = self.end_ids | set(sampling.stop_token_ids)
                return sample_iid_tree(
                    request.prompt_ids,
                    sampling,
                    self.tree.top_logprobs,
                    ends,
                    self._complete,
                    uniform,
                )
            return sample_tree(request.prompt_ids, sampling, self.tree, self._complete)
        if self.episodes is None:
            return self._complete(request.prompt_ids, sampling, None, images)
        return self.episodes.run(request.prompts, request.prompt_ids, sampling, self._complete)

    def _call(
        self,
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        budgets: list[int] | None,
        images: list | None = None,
    ) -> list[list[Completion]] | None:
        """One generation call through the gate (retried on a replaced worker); None once
        the run is ending."""
        while True:
            if not self.gate.enter():
                return None
            try:
                self.calls += 1
                with self.busy():
                    seed = self.seed + self.calls
                    extra = () if images is None else (images,)  # text-only: 5 arguments
                    out = self.generate_on(self.worker, prompt_ids, sampling, seed, budgets, *extra)
                    self.decode_steps += max(
                        (len(c.token_ids) for group in out or [] for c in group), default=0
                    )
                    return out
            except Exception as exc:  # noqa: BLE001 - replace_worker decides what is fatal
                failure = exc
            finally:
                self.gate.leave()
            # outside the gate: replacing a worker shuts it
            if self.replace_worker is None or not self.replace_worker(self.worker, failure):
                raise failure

    def _complete(
        self,
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> list[list[Completion]] | None:
        """``sampling.n`` finished completions per prompt (prompt i at most ``budgets[i]``
        tokens, showing ``images[i]``), continuing aborted ones (partial rollouts); None if
        the run ends first."""
        limits = budgets or [sampling.max_new_tokens] * len(prompt_ids)
        out = self._call(prompt_ids, sampling, budgets, images)
        while out is not None:
            pending = []
            for i, group in enumerate(out):
                for j, c in enumerate(group):
                    if c.finish_reason != "abort":
                        continue
                    if len(c.token_ids) >= limits[i]:  # nothing left to continue
                        group[j] = dataclasses.replace(c, finish_reason="length")
                    else:
                        pending.append((i, j))
            if not pending:
                return out
            if not self.partial:  # aborted only because the run is ending
                return None
            more = self._call(
                [prompt_ids[i] + out[i][j].token_ids for i, j in pending],
                dataclasses.replace(sampling, n=1),
                [limits[i] - len(out[i][j].token_ids) for i, j in pending],
                None if images is None else [images[i] for i, _ in pending],
            )
            if more is None:
                return None
            self.continued += len(pending)
            for (i, j), tail in zip(pending, more, strict=True):
                out[i][j] = out[i][j].continued(tail[0])
        return None
