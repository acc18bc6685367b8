"""Per-row reward choice by the row's ``data_source`` (``reward.by_source``), as verl's
datasets expect: one file mixing GSM8K, MATH and code rows scores each with its own verifier.

A row whose ``data_source`` is a key of ``reward.by_source`` is scored by the reward named
there; any other row (no ``data_source``, or one not listed) by the task's reward
(``task.reward``). The choice is made per item, so a batch may mix them."""

from __future__ import annotations

from collections.abc import Mapping

from rlsys.rewards.registry import RewardFn

SOURCE_KEY = "data_source"  # verl's column naming where a row comes from


class SourceRouter:
    """A ``RewardFn`` that hands each item to the reward its ``data_source`` names."""

    def __init__(self, default: RewardFn, routes: Mapping[str, RewardFn]):
        self.default, self.routes = default, dict(routes)

    def reward_for(self, metadata: dict) -> RewardFn:
        """The reward that scores an item with ``metadata``."""
        source = metadata.get(SOURCE_KEY)
        return self.routes.get(str(source), self.default) if source is not None else self.default

    def __call__(self, prompt: str, completion: str, metadata: dict) -> float | dict:
        return self.reward_for(metadata)(prompt, completion, metadata)
