"""Apply a reward function safely: an exception, a timeout or a reward that is not a finite
number gives reward 0 and a counted error."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
from dataclasses import dataclass

from rlsys.rewards.registry import RewardFn

log = logging.getLogger(__name__)
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="reward")


@dataclass
class RewardOutcome:
    """One scored completion."""

    reward: float
    correct: bool  # reward >= 1 for 0/1 verifiers, or the dict's ``correct`` entry
    error: str | None = None


def _call(fn: RewardFn, prompt: str, completion: str, metadata: dict):
    result = fn(prompt, completion, metadata)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


async def _await(awaitable):
    return await awaitable


def score(
    fn: RewardFn, prompt: str, completion: str, metadata: dict, timeout_s: float = 10.0
) -> RewardOutcome:
    """Run ``fn`` with a timeout; never raises."""
    try:
        result = _POOL.submit(_call, fn, prompt, completion, metadata).result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        return RewardOutcome(0.0, False, f"timeout after {timeout_s}s")
    except Exception as exc:  # a reward bug must not kill training
        log.debug("reward function failed: %r", exc)
        return RewardOutcome(0.0, False, f"{type(exc).__name__}: {exc}")
    try:
        reward = float(result["reward"] if isinstance(result, dict) else result)
    except (KeyError, TypeError, ValueError) as exc:
        return RewardOutcome(0.0, False, f"reward {result!r} is not a number: {exc}")
    if not math.isfinite(reward):
        return RewardOutcome(0.0, False, f"non-finite reward {reward!r}")
    if isinstance(result, dict):
        return RewardOutcome(reward, bool(result.get("correct", reward >= 1.0)))
    return RewardOutcome(reward, reward >= 1.0)
