"""Config of multi-turn environments (``task.env``): see docs/environments.md."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.checks import positive


@dataclass
class EnvConfig:
    """``task.env``: the environment a rollout talks to between model turns (null name:
    single-turn, the model answers once)."""

    name: str | None = None  # a registered environment: calculator | guess_number
    max_turns: int = 4  # model turns per trajectory; then it ends (truncated)
    # Response tokens over all turns, observations included (the model's turn gets what is
    # left, at most task.max_new_tokens); null: task.max_new_tokens x max_turns.
    max_total_tokens: int | None = None
    max_observation_tokens: int = 64  # a longer observation or tool result is cut to this

    def __post_init__(self) -> None:
        positive("task.env.max_turns", self.max_turns)
        positive("task.env.max_observation_tokens", self.max_observation_tokens)
        if self.max_total_tokens is not None:
            positive("task.env.max_total_tokens", self.max_total_tokens)
