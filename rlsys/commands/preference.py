"""``rlsys rm`` and ``rlsys dpo``: preference training from pairs (a file's, or synthesised
from the task), starting from ``model.path`` or its warm start."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from rlsys.commands.setup import plain_config, program_inputs, rollout_collector
from rlsys.commands.sft import warm_start
from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import TaskSplits
from rlsys.launch import local
from rlsys.models.loading import resolve_model_path
from rlsys.placement.resources import Roles
from rlsys.run.directory import make_run_dir, write_summary
from rlsys.run.lock import owns_run_dir
from rlsys.run.tracking import Tracker
from rlsys.trainers.preference.pairs import preference_pairs

log = logging.getLogger("rlsys")


def _starting_model(cfg: TrainConfig, tokenizer, task: TaskSplits, run_dir: Path):
    """The model preference training starts from: ``model.path``, warm-started first when
    ``warm_start.enabled`` (the SFT stage, cached as for ``rlsys train``)."""
    base = resolve_model_path(cfg.model)
    if cfg.warm_start.enabled:
        return warm_start(cfg, base, tokenizer, task, run_dir)
    return base, None


def _preference_setup(cfg: TrainConfig, kind: str):
    """What ``rlsys rm`` and ``rlsys dpo`` start from: checks, the run directory, Ray, the
    tokenizer, the screened task and the starting model (warm-started if enabled)."""
    local.preflight(cfg, Roles())
    _, tokenizer, task = program_inputs(cfg, rl=False)
    run_dir = make_run_dir(cfg, kind)
    log.info("run directory: %s", run_dir)
    local.connect_ray(cfg, Roles())
    start, warm = _starting_model(cfg, tokenizer, task, run_dir)
    return run_dir, tokenizer, task, start, warm


def _preference_summary(run_dir, result, data, start, warm, final, started) -> Path:
    """summary.json of ``rlsys rm`` / ``rlsys dpo``: the result, the pairs, the models."""
    return write_summary(
        run_dir,
        {
            **dataclasses.asdict(result),
            "data": data,
            "initial_model": start,
            "warm_start": warm,
            "run_dir": str(run_dir),
            "final_model": str(final),
            "total_wall_s": time.perf_counter() - started,
        },
    )


@owns_run_dir
def rm(cfg: TrainConfig) -> Path:
    """``rlsys rm``: train a reward model on preference pairs; it lands in
    ``checkpoints/final`` as a sequence-classification model for ``reward.model.paths``."""
    from rlsys.data.preferences import reward_model_rows
    from rlsys.placement.resources import plan_placement
    from rlsys.trainers.preference.rm import run_rm
    from rlsys.workers.learner import LearnerGroup
    from rlsys.workers.rollout import RolloutPool

    started = time.perf_counter()
    run_dir, tokenizer, task, start, warm = _preference_setup(cfg, "rm")
    placement = plan_placement(cfg, Roles())
    rollout = None
    if cfg.preference.samples_policy:
        rollout = RolloutPool(cfg.rollout, placement.rollout, start, cfg.model.dtype)
    try:
        train, evals, data = preference_pairs(
            cfg,
            tokenizer,
            task,
            reward_model_rows(tokenizer, cfg.task.chat_template),
            rollout.generate if rollout is not None else None,
        )
    finally:
        if rollout is not None:
            rollout.shutdown()  # before the reward model's learners take the CPUs
    learner = LearnerGroup(
        cfg.learner,
        placement.learner,
        start,
        cfg.model.dtype,
        1.0,
        role="reward",
        lora=cfg.model.lora,
    )
    tracker = Tracker(
        run_dir, cfg.tracking, run_dir.name, plain_config(cfg), cfg.rm.max_steps, "rm "
    )
    final = run_dir / "checkpoints" / "final"
    try:
        result = run_rm(cfg.rm, learner, train, evals, cfg.run.seed, tracker)
        learner.save_hf(str(final))
    finally:
        tracker.close()
        learner.shutdown()
        placement.release()
    log.info(
        "reward model: held-out pairwise accuracy %.3f -> %.3f; use it with "
        "reward.model.paths=[%s]",
        result.eval_pairwise_accuracy_before,
        result.eval_pairwise_accuracy,
        final,
    )
    return _preference_summary(run_dir, result, data, start, warm, final, started)


@owns_run_dir
def dpo(cfg: TrainConfig) -> Path:
    """``rlsys dpo``: DPO / IPO / conservative DPO of the policy on preference pairs; the
    policy lands in ``checkpoints/final``."""
    from rlsys.data.preferences import policy_rows
    from rlsys.trainers.preference.dpo import run_dpo
    from rlsys.workers.pools import start_pools

    started = time.perf_counter()
    run_dir, tokenizer, task, start, warm = _preference_setup(cfg, "dpo")
    pools = start_pools(cfg, start, Roles(), temperature=1.0)
    tracker = Tracker(
        run_dir, cfg.tracking, run_dir.name, plain_config(cfg), cfg.dpo.max_steps, "dpo "
    )
    final = run_dir / "checkpoints" / "final"
    try:
        collector = rollout_collector(cfg, pools, tokenizer)
        train, evals, data = preference_pairs(
            cfg, tokenizer, task, policy_rows(collector), pools.generate
        )
        result = run_dpo(
            cfg.dpo,
            pools,
            collector,
            train,
            evals,
            task.eval[: cfg.eval.num_prompts],
            cfg.eval.max_new_tokens or task.max_new_tokens,
            cfg.run.seed,
            tracker,
        )
        pools.learner.save_hf(str(final))
    finally:
        tracker.close()
        pools.shutdown()
    return _preference_summary(run_dir, result, data, start, warm, final, started)
