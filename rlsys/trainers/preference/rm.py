"""Reward-model training (``rlsys rm``): a Bradley-Terry loss on preference pairs, on the
learner backend (FSDP2 or DeepSpeed), with held-out pairwise accuracy.

The model is a sequence-classification head on the starting model's decoder (the SFT policy
by default, as in InstructGPT); it is saved as a Hugging Face directory that
``reward.model.paths`` takes as it is, and pairs are rendered and tokenized exactly as a
scoring reward model renders what it scores (``rlsys/models/reward_model.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from rlsys.algorithms.objectives import RewardModelObjective
from rlsys.config.preference import RMConfig
from rlsys.data.preferences import PairBatch, pair_margins, pairwise_accuracy, train_on_pairs
from rlsys.run.tracking import Tracker
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
    started = time.perf_counter()
    history = train_on_pairs(
        learner,
        train,
        RewardModelObjective(),
        lambda step: evaluate_rm(learner, evals),
        cfg.max_steps,
        cfg.batch_size,
        cfg.eval_every,
        "rm",
        seed,
        tracker,
    )
    first, last = history[0], history[-1]
    return RMResult(
        steps=cfg.max_steps,
        eval_pairwise_accuracy_before=first["eval/pairwise_accuracy"],
        eval_pairwise_accuracy=last["eval/pairwise_accuracy"],
        eval_margin=last["eval/margin"],
        wall_s=time.perf_counter() - started,
        eval_history=history,
    )
