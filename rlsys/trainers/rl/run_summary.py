"""The summary a finished ``rlsys train`` run writes (``summary.json``): its totals, the
sample accounting, evaluation history and what went wrong on the way."""

from __future__ import annotations

import dataclasses

from rlsys.algorithms.estimators import ADVANTAGES
from rlsys.config.schema import TrainConfig
from rlsys.trainers.collector import RolloutCollector
from rlsys.trainers.rl.recovery import Recovery
from rlsys.trainers.rl.state import RunState


def run_summary(
    cfg: TrainConfig,
    state: RunState,
    eval_split: int,
    collector: RolloutCollector,
    recovery: Recovery,
    preempted: bool,
    wall: float,
    accounting: dict,
) -> dict:
    """The run's summary after ``wall`` seconds (``eval_split``: held-out prompts the task
    has; ``accounting``: the buffer's, checked by the caller)."""
    train_wall = wall - state.totals.eval_s
    trained = accounting["samples_trained"]
    return {
        "steps": state.totals.steps,
        "wall_s": wall,
        "train_wall_s": train_wall,  # wall_s less evaluation
        "samples": state.totals.samples,
        "samples_per_s": state.totals.samples / train_wall if train_wall else 0.0,
        "trained_samples_per_s": trained / train_wall if train_wall else 0.0,
        "tokens_per_s": state.totals.response_tokens / train_wall if train_wall else 0.0,
        "max_staleness": cfg.buffer.max_staleness,
        "eval_accuracy_before": state.totals.accuracy_before,
        "eval_accuracy_after": state.totals.eval_history[-1]["eval/accuracy"],
        "eval_num_prompts": min(cfg.eval.num_prompts, eval_split),
        "eval_history": [
            {"step": e["step"], "accuracy": e["eval/accuracy"]} for e in state.totals.eval_history
        ],
        "accounting": accounting,
        "samples_dropped_filtered": state.buffer.stats.dropped_filtered,
        "samples_dropped_stale": state.buffer.stats.dropped_stale,
        "samples_continued": state.pipeline.samples_continued,
        # ReMax: one greedy reply per issued prompt, generated but never trained on
        "baseline_replies": accounting["samples_issued"] // cfg.rollout.n_samples
        if ADVANTAGES.trait(cfg.algorithm.advantage, "greedy_baseline")
        else 0,
        "reward_errors": collector.reward_errors,
        "prompts_skipped_too_long": collector.skipped_prompts,
        "policy_version": state.version,
        "preempted": preempted,
        "last_checkpoint": str(recovery.last_saved) if recovery.last_saved else None,
        "restarts": dataclasses.asdict(recovery.restarts),
        "nonfinite_steps": state.totals.nonfinite_steps,
        "scale_events": state.totals.scale_events,
    }
