"""A run's fresh parts: the streaming buffer, the prompt sampler and the pipeline of loops
that fill the buffer, built when the controller starts and again each time recovery goes
back to a checkpoint (the parts of the failed attempt are dropped, not mended)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlsys.algorithms.estimators import ADVANTAGES
from rlsys.buffer.replay import ReplayStore
from rlsys.buffer.streaming import StreamingBuffer, has_reward_variance
from rlsys.config.schema import TrainConfig
from rlsys.data.sampler import PromptSampler, make_sampler
from rlsys.models.loading import end_token_ids
from rlsys.pipeline import Pipeline, RolloutSide, ScoringSide
from rlsys.pipeline.rollout import ReplaceWorker
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import Prompt, Sample, SamplingParams, TrainBatch
from rlsys.workers.pools import Pools


@dataclass(frozen=True)
class RunParts:
    """``build()``: a fresh buffer, prompt sampler and pipeline for ``prompts``. ``pools`` is
    read at each build (a recovery may have replaced rollout workers); ``replace_worker`` is
    the recovery's, passed late-bound because recovery is built on the state these parts go
    into."""

    cfg: TrainConfig
    prompts: list[Prompt]
    pools: Pools
    collector: RolloutCollector
    sampling: SamplingParams
    shape_rewards: Callable[[list[Sample]], float]  # the recipe's overlong shaping
    reference_logprobs: Callable[[TrainBatch], np.ndarray] | None  # None: no KL to a reference
    replace_worker: ReplaceWorker
    pad_id: int

    def build(self) -> tuple[StreamingBuffer, PromptSampler, Pipeline]:
        cfg, algo = self.cfg, self.cfg.algorithm
        budget = cfg.trainer.max_samples
        greedy_baseline = ADVANTAGES.trait(algo.advantage, "greedy_baseline")
        # every generated reply counts against the budget, ReMax's greedy one per prompt too
        replies_per_group = cfg.rollout.n_samples + int(greedy_baseline)
        buffer = StreamingBuffer(
            cfg.data.batch_size,
            cfg.rollout.n_samples,
            cfg.buffer.max_staleness,
            has_reward_variance if algo.filter_uniform_groups else None,
            draw_rounds=algo.max_sampling_rounds if algo.dynamic_sampling else 1,
            max_groups=None if budget is None else math.ceil(budget / replies_per_group),
            max_steps=cfg.trainer.total_steps,
        )
        sampler = make_sampler(cfg.data, self.prompts, cfg.rollout.n_samples, cfg.run.seed)
        rollout_pool = self.pools.rollout
        rollout = RolloutSide(
            self.collector.encode,
            rollout_pool.generate_on,
            rollout_pool.abort,
            len(rollout_pool.workers),
            self.collector.build_groups,
            self.sampling,
            prompts_per_request=cfg.rollout.prompts_per_request,
            seed=cfg.run.seed * 1_000_003,
            greedy_baseline=greedy_baseline,
            partial=cfg.rollout.partial_rollouts,
            replace_worker=self.replace_worker,
            episodes=self.collector.episodes,
            tree=cfg.rollout.tree if cfg.rollout.tree.enabled else None,
            end_ids=self._end_ids(),
        )
        scoring = ScoringSide(
            self.collector.score,
            self.shape_rewards,
            self.reference_logprobs,
            self.pad_id,
            ReplayStore(cfg.buffer.replay) if cfg.buffer.replay.enabled else None,
        )
        return buffer, sampler, Pipeline(buffer, sampler, rollout, scoring)

    def _end_ids(self) -> frozenset[int]:
        """Tokens that end a reply, for iid tree rollouts (a reply that branches off onto one
        ends there): the engines' EOS ids and ``rollout.stop_token_ids``."""
        tree = self.cfg.rollout.tree
        if not (tree.enabled and tree.mode == "iid"):
            return frozenset()
        eos = end_token_ids(self.pools.rollout.model_path, self.collector.tokenizer)
        return frozenset([*eos, *self.cfg.rollout.stop_token_ids])
