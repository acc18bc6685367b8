"""The reward registry and the built-in rule-based verifiers.

A registered reward is a function ``(prompt, completion, metadata) -> float | dict``; one with
options registers its settings dataclass (``REWARDS.register(name, settings=MySettings)``,
``rlsys.algorithms.settings``) and takes it as a fourth argument, built once from
``reward.args.<name>`` (and the flat ``reward.*`` keys its fields name). A class with a
``from_config(cfg: RewardConfig)`` classmethod that builds such a callable serves a reward that
reads a whole config section (the sandboxed ``code_tests``: ``reward.sandbox``). A reward that
scores whole batches at once (a reward model) also has ``score_batch(prompts, completions,
metadatas)`` returning one float per item.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlsys.algorithms.settings import NoSettings, build_settings
from rlsys.config.errors import ConfigError
from rlsys.registry import Registry


class RewardFn(Protocol):
    """Scores one completion; returns a float, or a dict with at least ``reward``."""

    def __call__(self, prompt: str, completion: str, metadata: dict) -> float | dict: ...


# a reward function, or a class with from_config(RewardConfig) that makes one
REWARDS: Registry[RewardFn | type] = Registry("reward function", "task.reward")


@dataclass(frozen=True)
class WithSettings:
    """A reward registered with settings, bound to them: a ``RewardFn``."""

    fn: Callable[..., float | dict]
    settings: Any

    def __call__(self, prompt: str, completion: str, metadata: dict) -> float | dict:
        return self.fn(prompt, completion, metadata, self.settings)


def build_reward(name: str, cfg, key: str = "task.reward") -> RewardFn:
    """The reward registered as ``name`` (the value of config key ``key``), built from ``cfg``
    (a ``RewardConfig``; its ``args.<name>`` and flat keys feed the reward's settings, once)
    if it takes any; raises ConfigError naming a bad setting."""
    REWARDS.check(name, key)
    item = REWARDS.get(name)
    args = dict((cfg.args if cfg is not None else {}).get(name) or {})
    if hasattr(item, "from_config"):
        if args:
            raise ConfigError(
                f"reward.args.{name}: {name} reads its settings from its own reward.* section "
                f"(docs/config.md), not reward.args; remove reward.args.{name}"
            )
        return item.from_config(cfg)
    cls = REWARDS.settings(name) or NoSettings
    if cls is NoSettings and not args:
        return item
    settings = build_settings(cls, cfg, args, f"reward.args.{name}", f"{key}={name}")
    return WithSettings(item, settings)


@REWARDS.register("exact_match")
def exact_match(prompt: str, completion: str, metadata: dict) -> float:
    """1.0 when the completion, stripped of surrounding white space, equals the answer."""
    return float(completion.strip() == str(metadata["answer"]).strip())


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def numbers_in(text: str) -> list[str]:
    """The numbers in ``text`` in order (thousands separators removed)."""
    return _NUMBER.findall(text.replace(",", ""))


def same_number(found: str, answer: str) -> bool:
    """Whether two numeric strings denote the same value (False if either is not a number)."""
    try:
        return float(found) == float(str(answer).replace(",", ""))
    except ValueError:
        return False


@REWARDS.register("last_number")
def last_number(prompt: str, completion: str, metadata: dict) -> float:
    """1.0 when the last number in the completion equals the numeric answer."""
    numbers = numbers_in(completion)
    return float(bool(numbers) and same_number(numbers[-1], metadata["answer"]))


@REWARDS.register("env")
def env_reward(prompt: str, completion: str, metadata: dict) -> dict:
    """The multi-turn environment's own reward and verdict (``task.env``): turn-level rewards
    summed with the trajectory-level one."""
    if "env_reward" not in metadata:
        raise KeyError("task.reward=env needs a multi-turn task: set task.env.name")
    return {"reward": metadata["env_reward"], "correct": metadata["env_correct"]}
