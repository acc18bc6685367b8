"""Reward-model training (``rlsys rm``): a Bradley-Terry loss on preference pairs, on the
learner backend (FSDP2 or DeepSpeed), with held-out pairwise accuracy.

The model is a sequence-classification head on the starting model's decoder (the SFT policy
by default, as in InstructGPT); it is saved as a Hugging Face directory that
``reward.model.paths`` takes as it is, and pairs are rendered and tokenized exactly as the
reward-model worker renders what it scores.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from rlsys.algorithms.objectives import RewardModelObjective
from rlsys.config.preference import RMConfig
from rlsys.data.preferences import PairBatch, pair_margins, pairwise_accuracy, trim_padding
from rlsys.data.sampler import PromptSampler
from rlsys.tracking import Tracker
from rlsys.workers.learner import LearnerGroup

log = logging.getLogger(__name__)


@dataclass
class RMResult:
    """What reward-model training reached on the held-out pairs."""

    steps: int
    eval_pairwise_accuracy_before: float
    eval_pairwise_accuracy: float
    eval_margin: float  # mean score gap, chosen minus rejected
    wall_s: float
    eval_history: list[dict] = field(default_factory=list)


def evaluate_rm(learner: LearnerGroup, pairs: PairBatch) -> dict[str, float]:
    """Held-out pairwise accuracy (chosen scored strictly higher) and score statistics."""
    scores = learner.forward_scores(pairs.batch)
    margins = pair_margins(scores)
    return {
        "eval/pairwise_accuracy": pairwise_accuracy(margins),
        "eval/margin": float(np.mean(margins)),
        "eval/score_mean": float(np.mean(scores)),
        "eval/score_std": float(np.std(scores)),
    }


def run_rm(
    cfg: RMConfig,
    learner: LearnerGroup,
    train: PairBatch,
    evals: PairBatch,
    seed: int,
    tracker: Tracker,
) -> RMResult:
    """``cfg.max_steps`` Bradley-Terry steps of ``cfg.batch_size`` pairs, with a held-out
    evaluation before, every ``cfg.eval_every`` steps and at the end."""
    learner.set_lr(cfg.lr, decay_steps=cfg.max_steps)
    sampler = PromptSampler(list(range(len(train.kept))), cfg.batch_size, True, seed)
    objective = RewardModelObjective()
    started = time.perf_counter()
    first = evaluate_rm(learner, evals)
    tracker.log(0, first)
    history = [{"step": 0, **first}]
    last = first
    for step in range(1, cfg.max_steps + 1):
        rows = train.rows(np.array(sampler.next_batch()))
        batch = trim_padding(train.batch.select(rows))
        out = learner.train_step(batch, objective, seed + step, num_mini_batches=1, epochs=1)
        metrics = {f"rm/{k}": v for k, v in out.items()}
        if step % cfg.eval_every == 0 or step == cfg.max_steps:
            last = evaluate_rm(learner, evals)
            metrics.update(last)
            history.append({"step": step, **last})
        tracker.log(step, metrics)
    return RMResult(
        steps=cfg.max_steps,
        eval_pairwise_accuracy_before=first["eval/pairwise_accuracy"],
        eval_pairwise_accuracy=last["eval/pairwise_accuracy"],
        eval_margin=last["eval/margin"],
        wall_s=time.perf_counter() - started,
        eval_history=history,
    )
