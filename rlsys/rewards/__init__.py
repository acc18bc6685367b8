"""Reward functions: ``(prompt, completion, metadata) -> float``, chosen by ``task.reward``."""

from rlsys.rewards.registry import REWARDS, RewardFn
from rlsys.rewards.scoring import RewardOutcome, score

__all__ = ["REWARDS", "RewardFn", "RewardOutcome", "score"]
