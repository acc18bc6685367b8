"""Metrics of one RL step that are pure functions of what the step saw: the batch's
staleness and the queue, the update's train/critic figures, and time and throughput.
(The rollout metrics come from the pipeline's window: ``rollout_metrics.rollout_metrics``.)"""

from __future__ import annotations

import numpy as np

from rlsys.backends.data_parallel import micro_batch_rows, padding_fraction
from rlsys.backends.packing import PackInputs
from rlsys.buffer.streaming import StreamingBuffer
from rlsys.config.learner import LearnerConfig
from rlsys.types import RolloutGroup, TrainBatch


def batch_metrics(
    kept: list[RolloutGroup], buffer: StreamingBuffer, version: int, max_staleness: int
) -> dict[str, float]:
    """The batch's staleness histogram (against policy ``version``; replayed samples apart)
    and partial rollouts, the queue's depth."""
    out = {
        "buffer/groups_kept": len(kept),
        "buffer/queue_groups": len(buffer),
        "buffer/in_flight_groups": buffer.in_flight,
        "buffer/dropped_stale": buffer.stats.dropped_stale,
        "buffer/dropped_filtered": buffer.stats.dropped_filtered,
    }
    replayed = [version - s.completion.version for g in kept for s in g.samples if s.replayed]
    if replayed:  # older by design: bounded by buffer.replay.max_age, not the staleness bound
        out["buffer/replayed_samples"] = len(replayed)
        out["buffer/replay_age_mean"] = float(np.mean(replayed))
    samples = [s for g in kept for s in g.samples if not s.replayed]
    if not samples:
        return out
    lag = np.array([version - s.completion.version for s in samples])
    out["buffer/staleness_mean"] = float(lag.mean())
    out["buffer/staleness_max"] = int(lag.max())
    for k in range(max_staleness + 1):
        out[f"buffer/staleness_{k}"] = float((lag == k).mean())
    out["rollout/partial_frac"] = float(
        np.mean([len(set(s.completion.versions())) > 1 for s in samples])
    )
    return out


def train_metrics(
    train: dict[str, float],
    batch: TrainBatch,
    token_kl: np.ndarray | None,
    kl_coef: float | None,
    next_version: int,
) -> dict[str, float]:
    """The learner's ``train`` figures as ``train/*``, the KL to the reference (``token_kl``,
    at ``kl_coef``) or else the update's drift, engine-learner mismatch, advantages, the
    critic's targets, and the policy version this update makes."""
    out = {f"train/{k}": v for k, v in train.items()}
    mask = batch.loss_mask > 0
    # train/kl: per-token KL to the reference when there is one, else the update's drift.
    out["train/kl"] = train.get("approx_kl", 0.0)
    if token_kl is not None:
        trained = mask.any(-1)
        out["train/kl"] = float(token_kl[mask].mean()) if mask.any() else 0.0
        out["train/kl_ref_seq"] = float(token_kl[trained].sum(-1).mean()) if trained.any() else 0.0
        out["train/kl_coef"] = kl_coef
    if not mask.any():
        return out
    # engine vs learner before the update: numerics, plus policy lag when async (the
    # learner reports it when its training pass gave the old log-probabilities)
    if batch.old_logprobs is not None:
        out["train/logprob_mismatch"] = float(
            np.abs(batch.behaviour_logprobs[mask] - batch.old_logprobs[mask]).mean()
        )
    out["train/advantage_abs"] = float(np.abs(batch.advantages[mask]).mean())
    if batch.returns is not None:
        out["critic/return_mean"] = float(batch.returns[mask].mean())
        out["critic/value_mean_before"] = float(batch.values[mask].mean())
    out["policy/version"] = next_version
    return out


def perf_metrics(metrics: dict, stage_seconds: dict[str, float], step_s: float) -> dict[str, float]:
    """``metrics`` with each stage's seconds as ``time/<stage>``, the step's wall time and its
    throughput (evaluation time left out)."""
    samples = metrics.get("rollout/samples", 0)
    tokens = samples * metrics.get("rollout/response_tokens", 0.0)
    metrics.update({f"time/{k}": v for k, v in stage_seconds.items()})
    compute_s = step_s - metrics.get("time/eval", 0.0)
    metrics["perf/step_s"] = step_s
    metrics["perf/samples_per_s"] = samples / compute_s
    metrics["perf/tokens_per_s"] = tokens / compute_s
    metrics["pool/learner_idle_frac"] = stage_seconds["wait_for_batch"] / compute_s
    return metrics


def learner_padding(batch: TrainBatch, learner: LearnerConfig) -> float:
    """``perf/padding_frac``: the share of what the learner's forward passes compute that is
    padding, packed as it packs them (``learner.packing``, prompts shared with
    ``learner.share_prompts``) or row by row."""
    mask = batch.attention_mask
    micro = micro_batch_rows(
        learner.micro_batch_size, learner.max_tokens_per_micro_batch, mask.shape[1]
    )
    pack = None
    if learner.packing:
        pack = PackInputs.of(batch.input_ids, mask, batch.loss_mask, learner.share_prompts)
    return padding_fraction(mask, learner.world_size, micro, pack)
