"""Apply a reward function safely: an exception, a timeout or a reward that is not a finite
number gives reward 0 and a counted error, never a crash.

Each call runs on its own daemon thread, at most ``concurrency`` at once, and is waited for
at most ``timeout_s``: a call that hangs is abandoned (a thread cannot be killed; its slot is
freed) rather than blocking later calls. A reward that runs subprocesses checks
``abandoned()`` and stops them at once (the code sandbox does). Code that must be killed runs
in a subprocess (``rlsys.rewards.sandbox``) or on a reward worker actor
(``rlsys.rewards.pool``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field

from rlsys.rewards.registry import RewardFn

log = logging.getLogger(__name__)


@dataclass
class RewardOutcome:
    """One scored completion."""

    reward: float
    correct: bool  # reward >= 1 for 0/1 verifiers, or the dict's ``correct`` entry
    error: str | None = None
    components: dict[str, float] = field(default_factory=dict)  # name -> unweighted reward
    errors: int = 0  # components that failed (scored 0)


def _call(fn: RewardFn, prompt: str, completion: str, metadata: dict):
    result = fn(prompt, completion, metadata)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


async def _await(awaitable):
    return await awaitable


_local = threading.local()  # .call: the RewardCall this thread runs; .pid: in this process


def in_reward_call() -> bool:
    """Whether this thread is running a reward call (in this process: a child forked by the
    reward function is not)."""
    return getattr(_local, "call", None) is not None and _local.pid == os.getpid()


def abandoned() -> bool:
    """Whether the reward call running on this thread was given up on (it timed out): a
    reward should then stop its work and kill what it started."""
    return in_reward_call() and _local.call.gave_up.is_set()


class RewardCall(threading.Thread):
    """One reward call on a daemon thread, holding its result or exception."""

    def __init__(self, fn: RewardFn, args: tuple) -> None:
        super().__init__(daemon=True, name="reward")
        self.fn, self.args = fn, args
        self.result, self.exc = None, None
        self.gave_up = threading.Event()

    def run(self) -> None:
        _local.call, _local.pid = self, os.getpid()
        try:
            self.result = _call(self.fn, *self.args)
        except BaseException as exc:  # noqa: BLE001 - reported as the outcome
            self.exc = exc

    def abandon(self) -> None:
        """Give up on the call: ``abandoned()`` is true on its thread from now on."""
        self.gave_up.set()


def outcome_of(result) -> RewardOutcome:
    """A reward function's return value as an outcome: a finite number (an int too big for a
    float is not one), or a dict with such a ``reward`` and optionally a boolean or numeric
    ``correct``; anything else scores 0 with an error (never raises)."""
    if isinstance(result, RewardOutcome):  # a batch scorer that judged this item itself
        return result
    try:
        reward = _finite(result["reward"] if isinstance(result, dict) else result)
        if isinstance(result, dict) and result.get("correct") is not None:
            return RewardOutcome(reward, bool(_finite(result["correct"])))
    except Exception as exc:  # noqa: BLE001 - any return value must not stop scoring
        return RewardOutcome(
            0.0, False, f"reward {short_text(result)} refused: {short_text(exc, str)}"
        )
    return RewardOutcome(reward, reward >= 1.0)


def _finite(value) -> float:
    """``value`` as a finite float; text, overflowing ints, inf and nan raise."""
    if isinstance(value, str | bytes):
        raise TypeError(f"{type(value).__name__} is not a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{number!r} is not finite")
    return number


def short_text(value, text=repr, limit: int = 200) -> str:
    """``text(value)`` cut to ``limit`` characters (an int too long to print gives its type)."""
    try:
        out = text(value)
    except Exception:  # noqa: BLE001 - e.g. ValueError: an int past sys.get_int_max_str_digits
        return f"<{type(value).__name__}>"
    return out if len(out) <= limit else f"{out[:limit]}..."


def finite_total(outcome: RewardOutcome) -> RewardOutcome:
    """``outcome``, its reward set to 0 with one more error if the weighted sum overflowed."""
    if not math.isfinite(outcome.reward):
        outcome.error = outcome.error or f"the weighted total {outcome.reward} is not finite"
        outcome.reward, outcome.correct, outcome.errors = 0.0, False, outcome.errors + 1
    return outcome


def score_many(
    fn: RewardFn,
    items: list[tuple[str, str, dict]],
    timeout_s: float = 10.0,
    concurrency: int = 8,
) -> list[RewardOutcome]:
    """``fn`` on every ``(prompt, completion, metadata)``, ``concurrency`` calls at a time,
    each given ``timeout_s``; never raises."""
    outcomes: list[RewardOutcome] = []
    for start in range(0, len(items), concurrency):
        calls = [RewardCall(fn, item) for item in items[start : start + concurrency]]
        for call in calls:
            call.start()
        deadline = time.monotonic() + timeout_s
        for call in calls:
            call.join(max(0.0, deadline - time.monotonic()))
            if call.is_alive():
                call.abandon()
                outcomes.append(RewardOutcome(0.0, False, f"timeout after {timeout_s}s"))
            elif call.exc is not None:
                log.debug("reward function failed: %r", call.exc)
                why = f"{type(call.exc).__name__}: {short_text(call.exc, str, 1000)}"
                outcomes.append(RewardOutcome(0.0, False, why))
            else:
                outcomes.append(outcome_of(call.result))
    return outcomes


def score(
    fn: RewardFn, prompt: str, completion: str, metadata: dict, timeout_s: float = 10.0
) -> RewardOutcome:
    """``fn`` on one completion with a timeout; never raises."""
    return score_many(fn, [(prompt, completion, metadata)], timeout_s, 1)[0]
