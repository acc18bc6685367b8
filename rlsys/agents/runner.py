"""Rollouts by a user's agent loop written against the OpenAI client (``task.env.name=
openai_agent``, ``task.env.agent=package.module:function``).

``AgentRunner.run`` has ``EpisodeRunner.run``'s interface, so the rollout loop uses it
unchanged. Each trajectory gets a session on the endpoint (rlsys/agents/server.py) and a
thread that calls ``agent(openai.OpenAI(base_url=<session URL>), prompt) -> reward``. The
agent's chat completions queue here and go out from the rollout loop's own thread through its
``complete`` (gated, seeded, staleness-bounded), batched: a call waits until every live agent
has sent its next request or ``task.env.batch_wait_s`` passed. When every agent has returned
(or raised, or run past ``task.env.agent_timeout_s``: reward 0), each session's recorded calls
become one trajectory (rlsys/agents/stitch.py) whose ``episode.reward`` is the agent's return,
for ``task.reward=env``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from rlsys.agents.server import AgentServer
from rlsys.agents.session import CallSpec, Session
from rlsys.agents.stitch import stitch
from rlsys.config.env import EnvConfig
from rlsys.config.errors import ConfigError
from rlsys.envs.rollout import MIN_BATCH_WAIT_S, Complete
from rlsys.envs.tool_formats import ToolFormat
from rlsys.run.json_http import RequestError
from rlsys.types import Completion, Episode, Prompt, SamplingParams

log = logging.getLogger(__name__)
Agent = Callable[[Any, Prompt], float]  # (openai.OpenAI client, prompt) -> reward


def load_agent(spec: str) -> Agent:
    """The function ``task.env.agent`` names (``package.module:function``)."""
    module, _, name = spec.partition(":")
    try:
        agent = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"task.env.agent={spec!r} cannot be loaded ({exc}); name an importable "
            "package.module:function on the driver's PYTHONPATH"
        ) from exc
    if not callable(agent):
        raise ConfigError(f"task.env.agent={spec!r} is not a function")
    return agent


@dataclasses.dataclass
class _Call:
    """An agent's generation call waiting for the rollout loop's thread."""

    trajectory: int
    prompt_ids: list[int]
    stop: tuple[str, ...]
    budget: int
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Completion | None = None


@dataclasses.dataclass
class _Trajectory:
    prompt: Prompt
    session: Session
    deadline: float
    reward: float = 0.0
    error: bool = False
    finished: bool = False


class AgentRunner:
    """Runs ``agent`` once per trajectory over a rollout loop's ``complete``."""

    def __init__(
        self,
        agent: Agent,
        tokenizer,
        fmt: ToolFormat,
        cfg: EnvConfig,
        max_prompt_tokens: int | None,  # None: unresolved, no bound (see RolloutCollector)
    ) -> None:
        self.agent, self.tokenizer, self.fmt, self.cfg = agent, tokenizer, fmt, cfg
        self.max_prompt_tokens = max_prompt_tokens
        self.eos = tokenizer.eos_token_id
        self._server: AgentServer | None = None
        self._lock = threading.Lock()
        self._warned = False

    @property
    def server(self) -> AgentServer:
        """The endpoint, started on first use (in the driver, where the rollout loops run)."""
        with self._lock:
            if self._server is None:
                self._server = AgentServer(self.tokenizer, self.fmt)
            return self._server

    def total_tokens(self, turn_tokens: int) -> int:
        """A trajectory's bound after its first prompt when one call may take ``turn_tokens``."""
        return self.cfg.total_tokens(turn_tokens)

    def run(
        self,
        prompts: list[Prompt],
        prompt_ids: list[list[int]],
        sampling: SamplingParams,
        complete: Complete,
    ) -> list[list[Completion]] | None:
        """``sampling.n`` trajectories per prompt, one agent run each; None if the run ends
        first. ``sampling.max_new_tokens`` bounds one call."""
        inbox: queue.Queue = queue.Queue()
        state = _Run(inbox)
        total = self.total_tokens(sampling.max_new_tokens)
        deadline = time.monotonic() + self.cfg.agent_timeout_s
        server = self.server
        trajectories = []
        for prompt in prompts:
            for _ in range(sampling.n):
                index = len(trajectories)
                generate = self._generate_fn(index, state, total, sampling.max_new_tokens)
                trajectories.append(_Trajectory(prompt, server.open(generate), deadline))
        for index, t in enumerate(trajectories):
            threading.Thread(
                target=self._agent_main, args=(index, t, inbox), daemon=True, name="agent"
            ).start()
        try:
            if not self._serve(trajectories, state, sampling, complete):
                return None
        finally:
            state.close()
            for t in trajectories:
                server.close(t.session)
        _refuse_untrainable(trajectories)
        done = [self._completion(t) for t in trajectories]
        return [done[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def _serve(
        self,
        trajectories: list[_Trajectory],
        state: _Run,
        sampling: SamplingParams,
        complete: Complete,
    ) -> bool:
        """Send the agents' calls through ``complete`` until every agent is done; False if the
        run ended first."""
        waiting: list[_Call] = []
        try:
            return self._serve_calls(trajectories, state, sampling, complete, waiting)
        finally:
            for call in waiting:  # not generated (the run ended): the endpoint answers 503
                call.done.set()

    def _serve_calls(self, trajectories, state, sampling, complete, waiting: list[_Call]) -> bool:
        last_call_s = MIN_BATCH_WAIT_S
        while not all(t.finished for t in trajectories):
            live = sum(not t.finished for t in trajectories)
            now = time.monotonic()
            if waiting and len(waiting) >= live:
                timeout = 0.0  # every live agent waits on a call: send now
            elif waiting:
                wait = self.cfg.batch_wait_s
                timeout = wait if wait is not None else max(MIN_BATCH_WAIT_S, last_call_s)
            else:
                timeout = max(0.0, min(t.deadline for t in trajectories if not t.finished) - now)
            try:
                item = state.inbox.get(timeout=timeout) if timeout > 0 else state.inbox.get_nowait()
            except queue.Empty:
                item = None
            if isinstance(item, _Call):
                waiting.append(item)
                continue
            if isinstance(item, int):
                trajectories[item].finished = True
                continue
            waiting[:] = self._expire(trajectories, waiting)
            if not waiting:
                continue
            began = time.monotonic()
            if not self._generate(waiting, sampling, complete):
                return False
            last_call_s = time.monotonic() - began
            waiting.clear()
        return True

    def _expire(self, trajectories: list[_Trajectory], waiting: list[_Call]) -> list[_Call]:
        """Abandon agents past their deadline (reward 0); the calls of the others."""
        now = time.monotonic()
        for t in trajectories:
            if not t.finished and now >= t.deadline:
                log.warning(
                    "an agent ran past task.env.agent_timeout_s=%s: scored 0, its thread abandoned",
                    self.cfg.agent_timeout_s,
                )
                t.finished, t.error, t.reward = True, True, 0.0
                self.server.close(t.session)
        kept = []
        for call in waiting:
            if trajectories[call.trajectory].error and trajectories[call.trajectory].finished:
                call.done.set()  # result None: the endpoint answers 503
            else:
                kept.append(call)
        return kept

    def _generate(self, calls: list[_Call], sampling: SamplingParams, complete: Complete) -> bool:
        """One ``complete`` per distinct stop list; False if the run ended."""
        by_stop: dict[tuple[str, ...], list[_Call]] = {}
        for call in calls:
            by_stop.setdefault(call.stop, []).append(call)
        for stop, group in by_stop.items():
            params = dataclasses.replace(
                sampling, n=1, stop=list(dict.fromkeys([*sampling.stop, *stop]))
            )
            out = complete([c.prompt_ids for c in group], params, [c.budget for c in group])
            if out is None:
                return False
            for call, completions in zip(group, out, strict=True):
                call.result = completions[0]
                call.done.set()
        return True

    def _generate_fn(self, index: int, state: _Run, total: int, turn_tokens: int):
        """The session's ``generate``: bounds the call, queues it for the loop and waits."""

        def generate(session: Session, ids: list[int], spec: CallSpec) -> Completion | None:
            limit = self.max_prompt_tokens
            if not session.calls and limit is not None and len(ids) > limit:
                session.too_long = (
                    f"the first prompt has {len(ids)} tokens, over task.max_prompt_tokens="
                    f"{self.max_prompt_tokens}; send a shorter conversation or raise the bound"
                )
                raise RequestError(400, session.too_long, "messages", "context_length_exceeded")
            first = session.calls[0].prompt_ids if session.calls else ids
            room = total - (len(ids) - len(first))
            budget = min(room, turn_tokens, spec.max_tokens or turn_tokens)
            if len(session.calls) >= self.cfg.max_turns or budget <= 0:
                session.truncated = True  # answered "length" with no text, not recorded
                return Completion([], [], "length", 0)
            call = _Call(index, ids, spec.stop, budget)
            if not state.put(call):
                return None
            call.done.wait()
            return call.result

        return generate

    def _agent_main(self, index: int, t: _Trajectory, inbox: queue.Queue) -> None:
        """Run the agent on ``t``'s session; its return is the reward (0 if it raises)."""
        try:
            import openai

            client = openai.OpenAI(
                base_url=self.server.base_url(t.session),
                api_key="rlsys",
                max_retries=0,
                timeout=self.cfg.agent_timeout_s,
            )
            t.reward = float(self.agent(client, t.prompt))
        except Exception as exc:  # noqa: BLE001 - a failing agent scores 0, the run goes on
            t.error, t.reward = True, 0.0
            if not self._warned:
                self._warned = True
                log.warning("an agent raised (scored 0; later failures are not logged): %r", exc)
        finally:
            inbox.put(index)

    def _completion(self, t: _Trajectory) -> Completion:
        """``t``'s trajectory; without a recorded call, one masked EOS after the request's
        prompt (nothing to train on, the reward still counts in the group)."""
        reward = 0.0 if t.error else t.reward
        if t.session.calls:
            c = stitch(t.session.calls)
        else:
            episode = Episode()
            c = Completion([self.eos], [0.0], "stop", 0, [0], [0], episode, prompt_ids=None)
        episode = c.episode or Episode()
        episode.reward, episode.correct, episode.agent_error = reward, reward > 0, t.error
        episode.truncated = episode.truncated or t.session.truncated
        episode.tool_calls = t.session.tool_calls
        return c


def _refuse_untrainable(trajectories: list[_Trajectory]) -> None:
    """Raise when no agent of a batch got a generation because the endpoint refused their
    first prompts as too long: a setting, not an agent's failure, and every later batch would
    train on nothing while the run looked healthy (agents that fail on their own score 0)."""
    if any(t.session.calls for t in trajectories):
        return
    refused = [t.session.too_long for t in trajectories if t.session.too_long]
    if refused:
        raise ConfigError(
            f"task.env.name=openai_agent: no agent of a batch of {len(trajectories)} got a "
            f"generation; {len(refused)} were refused because {refused[0]}. Raise "
            "task.max_prompt_tokens (within the model's positions) or make the agent's first "
            "prompt shorter (tool declarations of the hermes/smollm2 formats count)"
        )


class _Run:
    """One ``run``'s inbox: the agents' calls and their done markers; closed when it returns,
    so a late call is answered at once instead of waiting for a loop that has gone."""

    def __init__(self, inbox: queue.Queue) -> None:
        self.inbox = inbox
        self.closed = False
        self.lock = threading.Lock()

    def put(self, call: _Call) -> bool:
        with self.lock:
            if self.closed:
                return False
            self.inbox.put(call)
            return True

    def close(self) -> None:
        with self.lock:
            self.closed = True
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, _Call):
                item.done.set()
