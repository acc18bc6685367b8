"""Environment steps (tool calls) off the rollout loop's thread, bounded and timed out.

Every ``env.step`` runs on a daemon thread of its own, started by a supervising daemon
thread that first takes a slot: one of ``task.env.max_concurrent_steps`` for the whole
environment and, when the environment names a limit for the turn's tool
(``tool_limits = {"search": 4}`` on its factory), one of that tool's. The supervisor waits
at most ``task.env.step_timeout_s`` for the step, gives the slots back and posts the outcome
to the caller's queue: the step's answer, or a timeout or the exception it raised. A step
that hangs keeps its (daemon) thread, which never blocks the process's exit, but not its
slots: a timed-out step no longer counts against the limits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Hashable

from rlsys.envs.base import Environment, StepResult
from rlsys.envs.tools import ToolCallError, find_call


@dataclasses.dataclass
class StepOutcome:
    """How one step went: its result (None if it raised or timed out), when it ran."""

    key: Hashable  # the caller's name for the step
    result: StepResult | None
    started: float  # time.monotonic() when it got its slots
    ended: float
    timed_out: bool = False
    error: BaseException | None = None


def tool_of(action: str) -> str | None:
    """The tool a turn calls (``rlsys.envs.tools`` format); None without a well-formed call."""
    try:
        call = find_call(action)
    except ToolCallError:
        return None
    return call.name if call is not None else None


class StepRunner:
    """Runs environment steps on daemon threads under the concurrency limits."""

    def __init__(
        self,
        max_concurrent: int,
        timeout_s: float | None,
        tool_limits: dict[str, int] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._slots = threading.Semaphore(max_concurrent)
        self._tool_slots = {
            name: threading.Semaphore(limit) for name, limit in (tool_limits or {}).items()
        }

    def submit(
        self,
        key: Hashable,
        env: Environment,
        action: str,
        done: queue.Queue,
    ) -> None:
        """Start ``env.step(action)``; its ``StepOutcome`` (named ``key``) goes to ``done``."""
        tool = self._tool_slots.get(tool_of(action)) if self._tool_slots else None
        threading.Thread(
            target=self._supervise,
            args=(key, env, action, done, tool),
            name="env-step",
            daemon=True,
        ).start()

    def _supervise(
        self,
        key: Hashable,
        env: Environment,
        action: str,
        done: queue.Queue,
        tool: threading.Semaphore | None,
    ) -> None:
        with self._slots, tool if tool is not None else contextlib.nullcontext():
            answer: list = []  # [StepResult] or [exception], written by the step's thread
            worker = threading.Thread(
                target=_step, args=(env, action, answer), name="env-step-call", daemon=True
            )
            started = time.monotonic()
            worker.start()
            worker.join(self.timeout_s)
            ended = time.monotonic()
        if worker.is_alive():  # abandoned: a daemon thread, and its slots are free again
            outcome = StepOutcome(key, None, started, ended, timed_out=True)
        elif isinstance(answer[0], BaseException):
            outcome = StepOutcome(key, None, started, ended, error=answer[0])
        else:
            outcome = StepOutcome(key, answer[0], started, ended)
        done.put(outcome)


def _step(env: Environment, action: str, answer: list) -> None:
    try:
        answer.append(env.step(action))
    except BaseException as exc:  # noqa: BLE001 - reported to the scheduler, which decides
        answer.append(exc)
