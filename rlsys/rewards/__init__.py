"""Rewards: registered functions ``(prompt, completion, metadata) -> float | dict`` (math,
format, sandboxed code, environment), user files, reward models, and their safe weighted
composition (``task.reward``, ``reward.*``; docs/rewards.md)."""

from rlsys.rewards import code as _code  # noqa: F401 - registers code_tests
from rlsys.rewards import math as _math  # noqa: F401 - registers the math rewards
from rlsys.rewards import sentiment as _sentiment  # noqa: F401 - registers sentiment
from rlsys.rewards.registry import REWARDS, RewardFn
from rlsys.rewards.scoring import RewardOutcome, score

__all__ = ["REWARDS", "RewardFn", "RewardOutcome", "score"]
