"""Direct preference optimisation (``rlsys dpo``): DPO, IPO or conservative DPO of the policy
on preference pairs, on the learner backend (FSDP2 or DeepSpeed).

The reference is the starting policy, frozen: before the first step the learner scores every
training and held-out pair once and those log-probabilities are cached with the batch, so no
reference model runs beside training. Evaluations report the held-out pairwise accuracy of
the implicit reward and, through the rollout pool, the task's greedy accuracy.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from rlsys.algorithms.objectives import DPOObjective
from rlsys.config.preference import DPOConfig
from rlsys.data.preferences import PairBatch, pair_margins, pairwise_accuracy, train_on_pairs
from rlsys.run.tracking import Tracker
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import Prompt
from rlsys.workers.pools import Pools

log = logging.getLogger(__name__)


@dataclass
class DPOResult:
    """What DPO reached: held-out pairwise accuracy of the implicit reward and the task's
    greedy accuracy, before and after."""

    steps: int
    eval_pairwise_accuracy_before: float
    eval_pairwise_accuracy: float
    eval_accuracy_before: float
    eval_accuracy_after: float
    reference_s: float  # computing the cached reference log-probabilities
    wall_s: float
    eval_history: list[dict] = field(default_factory=list)


def _sequence_logprobs(token_logprobs: np.ndarray, loss_mask: np.ndarray) -> np.ndarray:
    return (token_logprobs * loss_mask).sum(-1)


def cache_reference(pools: Pools, *batches: PairBatch) -> None:
    """Score every pair under the starting policy and keep the log-probabilities on the
    batch as ``ref_logprobs``; with LoRA under the base model, adapters off (the same
    numbers before the first step, since an adapter starts at zero)."""
    learner = pools.learner
    score = learner.forward_base_logprobs if learner.lora else learner.forward_logprobs
    for pairs in batches:
        pairs.batch.ref_logprobs = score(pairs.batch)


def evaluate_dpo(
    pools: Pools,
    collector: RolloutCollector,
    evals: PairBatch,
    prompts: list[Prompt],
    max_new_tokens: int,
    beta: float,
    version: int,
) -> dict[str, float]:
    """Held-out pairwise accuracy of the implicit reward ``beta (log pi - log ref)`` and the
    task's greedy accuracy (the new weights are sent to the rollout pool first)."""
    batch = evals.batch
    policy = _sequence_logprobs(pools.learner.forward_logprobs(batch), batch.loss_mask)
    reference = _sequence_logprobs(batch.ref_logprobs, batch.loss_mask)
    margins = beta * pair_margins(policy - reference)
    pools.sync_weights(version=version)
    result = collector.evaluate(prompts, max_new_tokens)
    return {
        "eval/pairwise_accuracy": pairwise_accuracy(margins),
        "eval/margin": float(np.mean(margins)),
        "eval/accuracy": result.accuracy,
        "eval/response_tokens": result.mean_response_tokens,
    }


def run_dpo(
    cfg: DPOConfig,
    pools: Pools,
    collector: RolloutCollector,
    train: PairBatch,
    evals: PairBatch,
    eval_prompts: list[Prompt],
    max_new_tokens: int,
    seed: int,
    tracker: Tracker,
) -> DPOResult:
    """``cfg.max_steps`` steps of ``cfg.batch_size`` pairs against the cached reference,
    evaluating before, every ``cfg.eval_every`` steps and at the end."""
    started = time.perf_counter()
    cache_reference(pools, train, evals)
    reference_s = time.perf_counter() - started
    log.info(
        "dpo: reference log-probabilities of %d pairs cached in %.1fs",
        len(train.kept) + len(evals.kept),
        reference_s,
    )
    pools.learner.set_lr(cfg.lr, decay_steps=cfg.max_steps)
    history = train_on_pairs(
        pools.learner,
        train,
        DPOObjective(cfg.beta, cfg.loss, cfg.label_smoothing, cfg.nll_coef),
        lambda step: evaluate_dpo(
            pools, collector, evals, eval_prompts, max_new_tokens, cfg.beta, version=step
        ),
        cfg.max_steps,
        cfg.batch_size,
        cfg.eval_every,
        "dpo",
        seed,
        tracker,
    )
    first, last = history[0], history[-1]
    return DPOResult(
        steps=cfg.max_steps,
        eval_pairwise_accuracy_before=first["eval/pairwise_accuracy"],
        eval_pairwise_accuracy=last["eval/pairwise_accuracy"],
        eval_accuracy_before=first["eval/accuracy"],
        eval_accuracy_after=last["eval/accuracy"],
        reference_s=reference_s,
        wall_s=time.perf_counter() - started,
        eval_history=history,
    )
