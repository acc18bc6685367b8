"""The reward registry and the built-in rule-based verifiers."""

from __future__ import annotations

import re
from typing import Protocol

from rlsys.registry import Registry


class RewardFn(Protocol):
    """Scores one completion; returns a float, or a dict with at least ``reward``."""

    def __call__(self, prompt: str, completion: str, metadata: dict) -> float | dict: ...


REWARDS: Registry = Registry("reward function", "task.reward")


@REWARDS.register("exact_match")
def exact_match(prompt: str, completion: str, metadata: dict) -> float:
    """1.0 when the completion, stripped of surrounding white space, equals the answer."""
    return float(completion.strip() == str(metadata["answer"]).strip())


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@REWARDS.register("last_number")
def last_number(prompt: str, completion: str, metadata: dict) -> float:
    """1.0 when the last number in the completion equals the numeric answer."""
    numbers = _NUMBER.findall(completion.replace(",", ""))
    if not numbers:
        return 0.0
    try:
        return float(float(numbers[-1]) == float(str(metadata["answer"]).replace(",", "")))
    except ValueError:
        return 0.0
