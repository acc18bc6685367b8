"""The multi-turn environment interface.

An environment is made per trajectory from its prompt. After every model turn the rollout
calls ``step`` with the turn's text; the environment answers with an observation (a tool
result, a game's reply) that is appended to the context as environment tokens (masked out
of the loss), a reward for that turn, and whether the trajectory is over. The rewards of
all turns are summed into the trajectory's ``Episode.reward``; reward functions on the
whole transcript (``task.reward``, ``reward.extra``) add trajectory-level terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rlsys.types import Prompt


@dataclass
class StepResult:
    """The environment's answer to one model turn."""

    observation: str | None = None  # appended after the turn (None: nothing to add)
    reward: float = 0.0  # this turn's reward
    done: bool = False  # the trajectory ends after this turn
    correct: bool | None = None  # the verdict so far, when the environment has one
    tool_call: bool = False  # the turn made a well-formed tool call that was answered
    tool_error: bool = False  # the turn's tool call was malformed or the tool failed


class Environment(Protocol):
    """One trajectory's environment. ``step`` must not raise on any model text: malformed
    actions are answered (and may be penalised), not errors.

    Optional: ``state_key() -> str``, the key of the environment's current state, read
    before each ``step``. Step-level advantages (``algorithm.advantage=gigpo``) compare the
    turns of a prompt's trajectories that acted on states with equal keys. Without it the key
    is a digest of the observations the trajectory has seen so far (equal observations, same
    state, whatever actions led there); define it when the state is something else, e.g. a
    game board that different observation histories reach, or observations that differ in
    details (timestamps) that do not matter.
    """

    def step(self, action: str) -> StepResult: ...


class EnvironmentFactory(Protocol):
    """Makes the environment of a prompt; knows how to demonstrate the task for SFT. The
    factory class is called with the run's ``task.env`` config (``EnvConfig``), and its settings
    if it registered any (``rlsys/envs/registry.py``), once per rollout collector."""

    def __call__(self, prompt: Prompt) -> Environment: ...

    def demonstration(self, prompt: Prompt) -> list[tuple[str, bool]]:
        """A good trajectory as (text, is_model_turn) segments, for the SFT warm start."""
        ...
