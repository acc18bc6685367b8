"""The rollout metrics of one RL step: what the pipeline did since the previous step."""

from __future__ import annotations

import numpy as np

from rlsys.buffer.streaming import has_reward_variance
from rlsys.config.schema import TrainConfig
from rlsys.trainers.collector import RolloutCollector
from rlsys.trainers.rl.sample_metrics import (
    episode_metrics,
    reward_component_metrics,
    step_group_metrics,
    tree_metrics,
)
from rlsys.trainers.rl.state import RunState
from rlsys.types import RolloutGroup
from rlsys.workers.pools import Pools


def rollout_metrics(
    cfg: TrainConfig,
    state: RunState,
    pools: Pools,
    collector: RolloutCollector,
    overlong_penalty: bool,
    window: tuple[list[RolloutGroup], list[float], float],
) -> tuple[dict[str, float], tuple[int, int]]:
    """What the pipeline did since the previous step (the scoring loop's ``window``: the
    groups scored, kept or not, their overlong penalties, the reference's seconds), prompts
    drawn and groups filtered since ``state.drawn`` and ``state.filtered``, busy and idle
    time; and the prompts drawn and groups filtered so far, for the next step's counts.
    Reads the run state, never writes it."""
    groups, penalties, reference_s = window
    samples = [s for g in groups for s in g.samples]
    tokens = sum(len(s.completion.token_ids) for s in samples)
    batch, n = cfg.data.batch_size, cfg.rollout.n_samples
    drawn, filtered = (
        state.pipeline.prompts_drawn,
        state.buffer.stats.dropped_filtered,
    )
    out = {
        "pool/rollout_workers": len(state.pipeline.rollouts),
        "pool/learner_ranks": len(pools.learner.workers),
        "rollout/sampling_rounds": (drawn - state.drawn) / batch,
        "rollout/groups_filtered": (filtered - state.filtered) / n,
        "rollout/reward_errors": float(collector.reward_errors),
        **state.pipeline.pool_metrics(),
        **state.sampler.metrics(),
    }
    if state.pipeline.replay is not None:
        out.update(state.pipeline.replay.metrics())
    if groups and cfg.rollout.n_samples > 1:
        uniform = sum(not has_reward_variance(g) for g in groups)
        out["rollout/uniform_group_frac"] = uniform / len(groups)
    if pools.critic is not None:
        out["pool/critic_ranks"] = len(pools.critic.workers)
    if cfg.algorithm.uses_reference:
        out["time/reference"] = reference_s  # part of the scoring loop's busy time
        out["time/scoring"] -= reference_s
    if overlong_penalty and penalties:
        out["rollout/overlong_penalty"] = float(np.mean(penalties))
    baselines = [g.baseline.reward for g in groups if g.baseline is not None]
    if baselines:
        out["rollout/baseline_reward"] = float(np.mean(baselines))  # ReMax's greedy replies
    if samples:
        out.update(
            {
                "rollout/samples": len(samples),
                "rollout/reward_mean": float(np.mean([s.reward for s in samples])),
                "rollout/accuracy": float(np.mean([s.correct for s in samples])),
                "rollout/response_tokens": tokens / len(samples),
                "rollout/stop_frac": float(
                    np.mean([s.completion.finish_reason == "stop" for s in samples])
                ),
                **reward_component_metrics(samples),
                **episode_metrics(samples),
                **tree_metrics(groups),
                **step_group_metrics(groups),
            }
        )
    return out, (drawn, filtered)
