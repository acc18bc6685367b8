"""The total reward of a completion: the task's verifier plus weighted extra rewards and
reward models, with per-component values and errors counted (``reward.*``)."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardConfig
from rlsys.rewards.judge import JudgeReward
from rlsys.rewards.registry import RewardFn, build_reward
from rlsys.rewards.remote import RemoteReward
from rlsys.rewards.routing import SourceRouter
from rlsys.rewards.scoring import (
    RewardCall,
    RewardOutcome,
    finite_total,
    outcome_of,
    score_many,
    short_text,
)
from rlsys.rewards.user_process import UserRewardProcess

Item = tuple[str, str, dict]  # (prompt, completion, metadata)


@dataclass
class Component:
    """One reward in the total: ``weight`` x its value. The ``verdict`` component decides
    ``correct`` (the task's verifier)."""

    name: str
    fn: RewardFn
    weight: float
    verdict: bool = False


def verifier_name(task_reward: str, cfg: RewardConfig) -> str:
    """The metric name of the verifier: ``task.reward``, ``user`` for ``reward.fn``, ``remote``
    for ``reward.url``."""
    return "user" if cfg.fn else "remote" if cfg.url else task_reward


def components_from_config(task_reward: str, cfg: RewardConfig) -> list[Component]:
    """The rule-based components ``cfg`` asks for (reward models are added by their pool); a
    user reward runs in a child process of its own, the built-in ones in this process."""
    if cfg.fn:
        verifier = UserRewardProcess(cfg.fn, cfg.timeout_s)
    elif cfg.url:
        verifier = RemoteReward(
            cfg.url, cfg.batch_size, cfg.timeout_s, cfg.url_retries, cfg.url_key_env
        )
    else:
        verifier = build_reward(task_reward, cfg)
        if cfg.by_source:
            routes = {
                source: build_reward(name, cfg, f"reward.by_source.{source}")
                for source, name in cfg.by_source.items()
            }
            verifier = SourceRouter(verifier, routes)
    components = [Component(verifier_name(task_reward, cfg), verifier, cfg.weight, True)]
    for name, weight in cfg.extra.items():
        components.append(
            Component(name, build_reward(name, cfg, f"reward.extra.{name}"), float(weight))
        )
    built = {c.name for c in components}
    for name in cfg.args:
        if name not in built:
            raise ConfigError(
                f"reward.args.{name}: {name} is not a reward of this run (its rewards are "
                f"{sorted(built)}); name one of them, or add {name} to reward.extra"
            )
    if cfg.judge.url:  # a judge the run serves has its URL set once its pool is up
        components.append(Component("judge", JudgeReward(cfg.judge), cfg.judge.weight))
    return components


class RewardScorer:
    """Scores batches of items with every component; a component that fails or times out on
    an item scores 0 there and counts one error (never raises)."""

    def __init__(self, components: list[Component], timeout_s: float, concurrency: int = 8):
        if sum(c.verdict for c in components) > 1:
            raise ValueError("at most one reward component may decide `correct`")
        self.components, self.timeout_s, self.concurrency = components, timeout_s, concurrency

    @classmethod
    def from_config(
        cls, task_reward: str, cfg: RewardConfig, more: list[Component] | None = None
    ) -> RewardScorer:
        return cls(components_from_config(task_reward, cfg) + list(more or []), cfg.timeout_s)

    def score(self, items: list[Item]) -> list[RewardOutcome]:
        """One outcome per item: the weighted total, the verdict, each component's value."""
        outcomes = [RewardOutcome(0.0, False) for _ in items]
        for component in self.components:
            for outcome, part in zip(
                outcomes, self._score_component(component, items), strict=True
            ):
                outcome.components[component.name] = part.reward
                outcome.reward += component.weight * part.reward
                if component.verdict:
                    outcome.correct = part.correct
                if part.error is not None:
                    outcome.errors += 1
                    outcome.error = outcome.error or f"{component.name}: {part.error}"
        return [finite_total(outcome) for outcome in outcomes]

    def _score_component(self, component: Component, items: list[Item]) -> list[RewardOutcome]:
        if not items:
            return []
        if isinstance(component.fn, UserRewardProcess):
            return component.fn.score_many(items, self.timeout_s, self.concurrency)
        if not hasattr(component.fn, "score_batch"):
            return score_many(component.fn, items, self.timeout_s, self.concurrency)
        # a batch scorer (a reward model): one call per chunk of its batch size, each with
        # the timeout
        size = getattr(component.fn, "batch_size", None) or len(items)
        return [
            outcome
            for start in range(0, len(items), size)
            for outcome in self._score_chunk(component, items[start : start + size])
        ]

    def _score_chunk(self, component: Component, items: list[Item]) -> list[RewardOutcome]:
        prompts, completions, metadatas = (list(column) for column in zip(*items, strict=True))
        call = RewardCall(
            lambda *args: component.fn.score_batch(*args), (prompts, completions, metadatas)
        )
        call.start()
        timeout_s = getattr(component.fn, "timeout_s", self.timeout_s)  # a judge's own
        call.join(timeout_s)
        if call.is_alive():
            call.abandon()
        if call.is_alive():
            why = f"timeout after {timeout_s}s"
        elif call.exc is not None:
            why = f"{type(call.exc).__name__}: {short_text(call.exc, str, 1000)}"
        else:
            scores = _batch_scores(call.result, len(items))
            if isinstance(scores, list):
                return [outcome_of(score) for score in scores]
            why = scores
        return [RewardOutcome(0.0, False, why) for _ in items]


def _batch_scores(result, count: int) -> list | str:
    """``score_batch``'s result as a list of ``count`` scores, else why it is not one."""
    try:
        scores = list(result)
    except Exception:  # noqa: BLE001 - whatever it returned, scoring goes on
        return f"score_batch returned {short_text(result)}, not a list of scores"
    if len(scores) != count:
        return f"{len(scores)} scores for {count} items"
    return scores


def merge(*parts: list[RewardOutcome]) -> list[RewardOutcome]:
    """Outcomes of disjoint component sets on the same items, added up (the first part's
    verdict is kept: it holds the verifier)."""
    out = []
    for group in zip(*parts, strict=True):
        first = group[0]
        total = RewardOutcome(0.0, first.correct)
        for part in group:
            total.reward += part.reward
            total.components.update(part.components)
            total.errors += part.errors
            total.error = total.error or part.error
        out.append(finite_total(total))
    return out
