"""Multi-turn rollouts: model turns alternate with environment observations.

Every trajectory is one ``Completion`` whose tokens are the model's turns and the
observations between them, in order; ``mask`` is 0 on the observations so the loss skips
them, their behaviour logprobs are 0, and each token keeps the policy version that produced
it (observations take their turn's). The model's tokens are never re-tokenised: what the
learner trains on is exactly what the engine sampled (token in, token out). Trajectories
end when the environment says so, after ``task.env.max_turns`` model turns, or when the
next turn would have no room in ``max_total_tokens``. With a chat tool format
(``task.env.tool_format``) the transcript of each trajectory translates between the model's
calls and the environment's compact API and renders observations with the chat template
(rlsys/envs/chat_turns.py).

Scheduling (``task.env.scheduling``): with ``async`` each trajectory advances on its own.
Its environment step (a tool call) runs off the rollout loop's thread (``StepRunner``:
bounded by ``task.env.max_concurrent_steps``, timed out by ``step_timeout_s``) while other
trajectories generate; the trajectories whose steps returned while a generation call was in
flight go out together as the next call, so the engine still sees batches, and the steps of
the turns that call generated start as soon as it returns. With ``lockstep`` every live
trajectory's next turn shares one call, made once all of their steps returned.

next turn would have no room in ``max_total_tokens``.

Each model turn is also recorded as a ``Turn`` (its token span, its reward and the key of
the state it acted on), for step-level advantages (GiGPO). The key is the environment's
``state_key()`` where it defines one, else a digest of the observation tokens the trajectory
has seen so far: the first turn of every trajectory of a group acts on the same state (the
prompt alone), and later turns share a key when their observations so far are identical.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import queue
import time
from collections.abc import Callable

from rlsys.config.env import EnvConfig
from rlsys.envs.base import Environment, EnvironmentFactory, StepResult
from rlsys.envs.chat_turns import CompactTurns, Transcript, Turns
from rlsys.envs.steps import StepOutcome, StepRunner
from rlsys.types import Completion, Episode, Prompt, SamplingParams, Turn

log = logging.getLogger(__name__)
MIN_BATCH_WAIT_S = 0.01  # covers the threads' wake-up jitter: steps done together batch
# (prompt ids, sampling, per-prompt budgets) -> completions per prompt; None: the run ends
Complete = Callable[
    [list[list[int]], SamplingParams, list[int] | None], list[list[Completion]] | None
]


@dataclasses.dataclass
class _Trajectory:
    env: Environment
    prompt_ids: list[int]
    budget: int  # response tokens in total
    transcript: Transcript  # translates turns and observations (the run's tool format)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    mask: list[int] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    finish: str = "stop"
    episode: Episode = dataclasses.field(default_factory=Episode)
    turns: list[Turn] = dataclasses.field(default_factory=list)
    seen: str = ""  # digest of the observations so far: the default anchor-state key

    def completion(self) -> Completion:
        return Completion(
            self.tokens,
            self.logprobs,
            self.finish,
            min(self.versions) if self.versions else 0,
            self.versions,
            self.mask,
            self.episode,
            turns=self.turns,
        )


def _extend_digest(digest: str, observation: list[int]) -> str:
    """The state digest after ``observation`` (token ids) follows the state ``digest``."""
    data = f"{digest}|{','.join(map(str, observation))}".encode()
    return hashlib.blake2b(data, digest_size=12).hexdigest()


class EpisodeRunner:
    """Runs the environments of ``factory`` over a rollout engine's ``complete``."""

    def __init__(
        self, factory: EnvironmentFactory, tokenizer, cfg: EnvConfig, turns: Turns | None = None
    ) -> None:
        self.factory, self.tokenizer, self.cfg = factory, tokenizer, cfg
        self.turns = turns or CompactTurns(factory, tokenizer, cfg.max_observation_tokens)
        self.stop = list(self.turns.stop)
        self.end_ids = {tokenizer.eos_token_id}  # a turn ending in one ends the reply
        # shared by every rollout loop of this driver: the limits hold for the environment
        self.steps = StepRunner(
            cfg.max_concurrent_steps, cfg.step_timeout_s, getattr(factory, "tool_limits", None)
        )

    def total_tokens(self, turn_tokens: int) -> int:
        """A trajectory's response-token bound when one model turn may take ``turn_tokens``."""
        return self.cfg.total_tokens(turn_tokens)

    def run(
        self,
        prompts: list[Prompt],
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        complete: Complete,
    ) -> list[list[Completion]] | None:
        """``sampling.n`` trajectories per prompt; None if the run ends first. The first turn
        samples the n trajectories of a prompt together (one shared prompt); later turns
        continue each trajectory on its own. ``sampling.max_new_tokens`` bounds one turn."""
        turn_tokens = sampling.max_new_tokens
        total = self.total_tokens(turn_tokens)
        turn = dataclasses.replace(
            sampling,
            stop=list(dict.fromkeys([*sampling.stop, *self.stop])),
            max_new_tokens=min(turn_tokens, total),
        )
        began = time.monotonic()
        first = complete(prompt_ids, turn, None)
        if first is None:
            return None
        calls = [(began, time.monotonic())]  # this request's generation calls, in time
        trajectories = [
            [_Trajectory(self.factory(p), ids, total, self.turns.start(p)) for _ in group]
            for p, ids, group in zip(prompts, prompt_ids, first, strict=True)
        ]
        turns = [
            (t, c)
            for row, group in zip(trajectories, first, strict=True)
            for t, c in zip(row, group, strict=True)
        ]
        ends = self.end_ids | set(sampling.stop_token_ids)
        schedule = self._async if self.cfg.scheduling == "async" else self._lockstep
        if not schedule(turns, dataclasses.replace(turn, n=1), ends, complete, calls):
            return None
        return [[t.completion() for t in row] for row in trajectories]

    def _lockstep(
        self,
        turns: list[tuple[_Trajectory, Completion]],
        single: SamplingParams,
        ends: set[int],
        complete: Complete,
        calls: list[tuple[float, float]],
    ) -> bool:
        """All live trajectories' steps, then one call for all their next turns; False if
        the run ended first. (No step overlaps a call: ``calls`` goes unused.)"""
        while turns:
            done: queue.Queue = queue.Queue()
            for key, (t, c) in enumerate(turns):
                self._start_step(key, t, c, done)
            outcomes = sorted((done.get() for _ in turns), key=lambda o: o.key)
            live = [
                t
                for (t, c), outcome in zip(turns, outcomes, strict=True)
                if self._take_step(t, c, outcome, ends, [])
            ]
            if not live:
                return True
            out = complete(
                [t.prompt_ids + t.tokens for t in live],
                single,
                self._budgets(live, single.max_new_tokens),
            )
            if out is None:
                return False
            turns = [(t, group[0]) for t, group in zip(live, out, strict=True)]
        return True

    def _async(
        self,
        turns: list[tuple[_Trajectory, Completion]],
        single: SamplingParams,
        ends: set[int],
        complete: Complete,
        calls: list[tuple[float, float]],
    ) -> bool:
        """Each trajectory's step starts as soon as its turn is generated, and its next turn
        goes out with the next call after its step returned; False if the run ended first."""
        done: queue.Queue = queue.Queue()
        keys = itertools.count()
        stepping: dict[int, tuple[_Trajectory, Completion]] = {}
        while True:
            for t, c in turns:
                key = next(keys)
                stepping[key] = (t, c)
                self._start_step(key, t, c, done)
            if not stepping:
                return True
            ready = self._gather(done, stepping, ends, calls)
            if not ready:
                turns = []
                continue
            began = time.monotonic()
            out = complete(
                [t.prompt_ids + t.tokens for t in ready],
                single,
                self._budgets(ready, single.max_new_tokens),
            )
            if out is None:  # steps still running are abandoned (their threads are daemons)
                return False
            calls.append((began, time.monotonic()))
            turns = [(t, group[0]) for t, group in zip(ready, out, strict=True)]

    def _gather(
        self,
        done: queue.Queue,
        stepping: dict[int, tuple[_Trajectory, Completion]],
        ends: set[int],
        calls: list[tuple[float, float]],
    ) -> list[_Trajectory]:
        """The trajectories whose steps returned and which go on: blocks for the first step
        to return, then takes every other one that returns within ``task.env.batch_wait_s``
        of it, or of the last call's end if it returned while that call ran (null: the
        last call's duration, at least ``MIN_BATCH_WAIT_S``)."""
        wait = self.cfg.batch_wait_s
        if wait is None:
            wait = max(MIN_BATCH_WAIT_S, calls[-1][1] - calls[-1][0])
        ready: list[tuple[int, _Trajectory]] = []
        deadline = None
        while stepping:
            try:
                if deadline is None:
                    outcome = done.get()
                else:
                    outcome = done.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            t, c = stepping.pop(outcome.key)
            if self._take_step(t, c, outcome, ends, calls):
                ready.append((outcome.key, t))
            # the clock starts when both the step and the engine are done (ski rental: wait
            # at most about what sending without the others would cost, one more call)
            last = max(outcome.ended, calls[-1][1]) + wait
            deadline = last if deadline is None else min(deadline, last)
        return [t for _, t in sorted(ready, key=lambda r: r[0])]  # in the order steps began

    @staticmethod
    def _budgets(live: list[_Trajectory], turn_tokens: int) -> list[int]:
        """Each trajectory's next-turn bound: what is left of its total, at most one turn."""
        return [min(turn_tokens, t.budget - len(t.tokens)) for t in live]

    def _start_step(self, key: int, t: _Trajectory, turn: Completion, done: queue.Queue) -> None:
        """Append ``turn`` and start the environment's step on it (the outcome goes to
        ``done``, named ``key``)."""
        self._append_turn(t, turn)
        text = self.tokenizer.decode(turn.token_ids, skip_special_tokens=True)
        action = t.transcript.action(text)
        if isinstance(action, StepResult):  # answered by the transcript (a malformed call)
            now = time.monotonic()
            done.put(StepOutcome(key, action, now, now))
        else:
            self.steps.submit(key, t.env, action, done)

    def _take_step(
        self,
        t: _Trajectory,
        turn: Completion,
        outcome: StepOutcome,
        ends: set[int],
        calls: list[tuple[float, float]],
    ) -> bool:
        """Record a step's time (and how much of it overlapped the generation ``calls``),
        then append its answer; whether the trajectory goes on. A step that raised or timed
        out ends its trajectory with a tool error."""
        spent = outcome.ended - outcome.started
        t.episode.tool_s += spent
        t.episode.tool_overlap_s += sum(
            max(0.0, min(outcome.ended, end) - max(outcome.started, start)) for start, end in calls
        )
        result = outcome.result
        if outcome.timed_out:
            log.warning("environment step timed out after %.1f s, trajectory ended", spent)
            t.episode.tool_timeouts += 1
        elif outcome.error is not None:
            log.warning("environment step failed, trajectory ended: %r", outcome.error)
        if result is None:  # an environment bug or a hung tool ends this trajectory only
            result = StepResult(done=True, tool_error=True)
        return self._append_observation(t, turn, result, ends)

    def _append_turn(self, t: _Trajectory, turn: Completion) -> None:
        """Append a model turn and record it as a ``Turn`` (its reward comes with the step's
        answer), keyed by the state it acted on."""
        start, state = len(t.tokens), t.seen
        t.tokens += turn.token_ids
        t.logprobs += turn.logprobs
        t.mask += [1] * len(turn.token_ids)
        t.versions += turn.versions()
        t.finish = turn.finish_reason
        t.episode.turns += 1
        t.episode.truncated = turn.finish_reason == "length"  # cut by a token bound
        if hasattr(t.env, "state_key"):  # the environment's own anchor-state key
            try:
                state = str(t.env.state_key())
            except Exception as exc:  # noqa: BLE001 - an environment bug: the default key
                log.warning("environment state_key() failed, observation digest used: %r", exc)
        t.turns.append(Turn(start, len(t.tokens), 0.0, state))

    def _append_observation(
        self, t: _Trajectory, turn: Completion, result: StepResult, ends: set[int]
    ) -> bool:
        """Append the environment's answer to ``turn``; whether the trajectory goes on.
        A turn whose last token is EOS (or a stop token) ends the reply; one that stopped at
        an environment stop string goes on (an engine may keep text after the match inside
        the matching token, so the ids decide, not the text)."""
        t.turns[-1].reward = result.reward
        t.episode.reward += result.reward
        t.episode.tool_calls += int(result.tool_call)
        t.episode.tool_errors += int(result.tool_error)
        if result.correct is not None:
            t.episode.correct = result.correct
        if result.done:
            return False
        eos_ended = bool(turn.token_ids) and turn.token_ids[-1] in ends
        if eos_ended or result.observation is None:
            return False  # the model ended its reply; nothing more to say to it
        observation = t.transcript.observation_ids(result.observation)
        room = t.budget - len(t.tokens) - len(observation)
        if t.episode.turns >= self.cfg.max_turns or room <= 0:
            t.episode.truncated = True
            t.finish = "length"  # cut by a bound: overlong filtering and stop_frac see it
            return False
        version = t.versions[-1] if t.versions else turn.version
        t.tokens += observation
        t.logprobs += [0.0] * len(observation)
        t.mask += [0] * len(observation)
        t.versions += [version] * len(observation)
        t.seen = _extend_digest(t.seen, observation)
        return True
