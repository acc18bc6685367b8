"""The pairs ``rlsys rm`` and ``rlsys dpo`` train on: read from a file or synthesised from the
task (``preference.*``), sampled from the starting model where the synthesis asks for its
replies, and packed into token ids with the trainer's row encoder."""

from __future__ import annotations

import logging

from rlsys.config.schema import TrainConfig
from rlsys.data.preferences import load_pairs, pack_pairs, sample_replies
from rlsys.data.tasks import TaskSplits
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import SamplingParams

log = logging.getLogger(__name__)


def _draw_pairs(cfg: TrainConfig, task: TaskSplits, generate, tokenizer):
    """``preference.*``'s pairs; synthetic pairs made of the starting model's replies
    (``preference.synthetic``: mistakes, ranked) sample them through ``generate`` (its
    rollout pool)."""
    pref = cfg.preference
    if not pref.samples_policy:
        return load_pairs(pref, task, cfg.run.seed)
    sampling = SamplingParams(
        n=pref.samples_per_prompt,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_new_tokens=task.max_new_tokens,
    )
    collector = RolloutCollector.for_task(generate, tokenizer, cfg.task, cfg.reward)
    log.info(
        "preference pairs (%s): sampling %d replies per prompt from the starting model",
        pref.synthetic,
        pref.samples_per_prompt,
    )
    return load_pairs(pref, task, cfg.run.seed, sample_replies(collector, sampling, cfg.run.seed))


def preference_pairs(cfg: TrainConfig, tokenizer, task: TaskSplits, encode, generate=None):
    """Training and held-out pairs of ``preference.*``, packed with ``encode``."""
    splits = _draw_pairs(cfg, task, generate, tokenizer)
    pad, limit = tokenizer.pad_token_id, cfg.preference.max_length
    train = pack_pairs(splits.train, encode, pad, limit)
    evals = pack_pairs(splits.eval, encode, pad, limit)
    info = {
        **splits.summary(),
        "train_pairs": len(train.kept),
        "eval_pairs": len(evals.kept),
        "skipped_too_long": train.skipped_too_long + evals.skipped_too_long,
    }
    log.info(
        "preference pairs (%s): %d train / %d held out; skipped %d malformed rows and %d "
        "pairs over preference.max_length=%d",
        info["source"],
        info["train_pairs"],
        info["eval_pairs"],
        info["skipped_malformed_rows"],
        info["skipped_too_long"],
        limit,
    )
    return train, evals, info
