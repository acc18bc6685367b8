"""What a run scores with: the rule-based rewards (in this process, or on reward worker
actors with ``reward.num_workers`` > 0) plus the reward models of ``reward.model.paths``
on their own actors, and the judge servers of ``reward.judge.model_path``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlsys.config.reward import RewardConfig
from rlsys.placement.resources import ActorResources
from rlsys.rewards.scorer import Component, Item, RewardScorer, merge
from rlsys.rewards.scoring import RewardOutcome


class RewardService:
    """``score(items)`` over every reward of the run; ``shutdown`` stops its actors."""

    def __init__(
        self,
        task_reward: str,
        cfg: RewardConfig,
        worker_resources: ActorResources | None = None,
        chat: bool = False,
        model_resources: ActorResources | None = None,
        judge_resources: ActorResources | None = None,
    ) -> None:
        self.pool = self.models = self.judges = None
        try:
            if cfg.judge.model_path is not None:
                from rlsys.rewards.judge_pool import JudgePool

                self.judges = JudgePool(cfg.judge, judge_resources or ActorResources(1.0, 0.0, 1))
                cfg = dataclasses.replace(cfg, judge=self.judges.judge_config())
            model = []
            if cfg.model.paths:
                from rlsys.rewards.model import RewardModelScorer

                self.models = RewardModelScorer(cfg.model, chat=chat, resources=model_resources)
                model = [Component("model", self.models, cfg.model.weight)]
            if cfg.num_workers:
                from rlsys.rewards.pool import RewardPool

                if cfg.fn:  # the workers import it: pass a path that does not depend on cwd
                    path, _, name = cfg.fn.rpartition(":")
                    cfg = dataclasses.replace(cfg, fn=f"{Path(path).resolve()}:{name}")

                self.pool = RewardPool(task_reward, cfg, worker_resources)
                self.local = RewardScorer(model, cfg.timeout_s) if model else None
            else:
                self.local = RewardScorer.from_config(task_reward, cfg, model)
        except BaseException:
            self.shutdown()
            raise

    def score(self, items: list[Item]) -> list[RewardOutcome]:
        parts = []
        if self.pool is not None:
            parts.append(self.pool.score(items))
        if self.local is not None:
            parts.append(self.local.score(items))
        return merge(*parts) if len(parts) > 1 else parts[0]

    def shutdown(self) -> None:
        for part in (self.pool, self.models, self.judges):
            if part is not None:
                part.shutdown()
