"""``rlsys sft``: supervised fine-tuning; and the warm start before RL and preference
training (the same SFT, cached by its inputs)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from rlsys.commands.setup import plain_config, program_inputs, rollout_collector
from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import TaskSplits
from rlsys.launch import local
from rlsys.placement.resources import Roles
from rlsys.run.cache import atomic_dir, cache_dir, fingerprint
from rlsys.run.directory import make_run_dir, write_summary
from rlsys.run.lock import owns_run_dir
from rlsys.run.tracking import Tracker

log = logging.getLogger("rlsys")


def _sft_to(
    cfg: TrainConfig,
    model_path: str,
    out: Path,
    tokenizer,
    task: TaskSplits,
    tracker: Tracker | None,
) -> dict:
    """Run SFT from ``model_path`` on fresh pools and save the result to ``out``."""
    from rlsys.trainers.sft import run_sft
    from rlsys.workers.pools import start_pools

    pools = start_pools(cfg, model_path, Roles(), temperature=1.0)
    try:
        result = run_sft(
            cfg.sft,
            pools,
            rollout_collector(cfg, pools, tokenizer),
            task,
            tokenizer,
            cfg.run.seed,
            tracker,
        )
        pools.learner.save_hf(str(out))
    finally:
        pools.shutdown()
    return dataclasses.asdict(result)


def _warm_start_cache_dir(cfg: TrainConfig, base_path: str) -> Path:
    """Where the warm start with these inputs is cached (everything SFT's result depends on)."""
    key = fingerprint(
        {
            "base": base_path,
            "model": dataclasses.asdict(cfg.model),
            "task": dataclasses.asdict(cfg.task),
            "sft": dataclasses.asdict(cfg.sft),
            "optim": {  # what SFT uses of the learner's optimizer (its lr is sft.lr)
                k: v
                for k, v in dataclasses.asdict(cfg.learner.optim).items()
                if k in ("warmup_steps", "betas", "weight_decay", "grad_clip")
            },
            "seed": cfg.run.seed,
        }
    )
    return cache_dir() / "warm_start" / key


def warm_start(
    cfg: TrainConfig, base_path: str, tokenizer, task: TaskSplits, run_dir: Path
) -> tuple[str, dict]:
    """The warm-started model directory: SFT once, cached by its inputs; with
    ``warm_start.cache=false`` a fresh SFT whose model stays in the run directory."""
    if not cfg.warm_start.cache:
        target = run_dir / "checkpoints" / "warm_start"
    else:
        target = _warm_start_cache_dir(cfg, base_path)
        if (target / "config.json").exists():
            log.info("warm start: using cached %s", target)
            return str(target), {"cached": True, "path": str(target)}
    if cfg.sft.target_accuracy is None:
        log.info("warm start: SFT for %d steps (sft.target_accuracy=null)", cfg.sft.max_steps)
    else:
        log.info(
            "warm start: SFT until held-out greedy accuracy >= %s (at most %d steps)",
            cfg.sft.target_accuracy,
            cfg.sft.max_steps,
        )
    with atomic_dir(target) as tmp:  # a crash mid-SFT leaves no half-written cache entry
        info = _sft_to(cfg, base_path, tmp, tokenizer, task, None)
    log.info(
        "warm start: %d SFT steps, accuracy %.3f, %.1fs",
        info["steps"],
        info["eval_accuracy"],
        info["wall_s"],
    )
    return str(target), {"cached": False, "path": str(target), **info}


@owns_run_dir
def sft(cfg: TrainConfig) -> Path:
    """``rlsys sft``: supervised fine-tuning; the model lands in ``checkpoints/final``."""
    started = time.perf_counter()
    local.preflight(cfg, Roles())
    base, tokenizer, task = program_inputs(cfg, rl=False)
    run_dir = make_run_dir(cfg, "sft")
    local.connect_ray(cfg, Roles())
    tracker = Tracker(
        run_dir, cfg.tracking, run_dir.name, plain_config(cfg), cfg.sft.max_steps, "sft "
    )
    final = run_dir / "checkpoints" / "final"
    try:
        info = _sft_to(cfg, base, final, tokenizer, task, tracker)
    finally:
        tracker.close()
    return write_summary(
        run_dir,
        {
            **info,
            "run_dir": str(run_dir),
            "final_model": str(final),
            "total_wall_s": time.perf_counter() - started,
        },
    )
