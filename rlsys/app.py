"""The commands behind the CLI: train, sft and eval, wired from one validated config."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from rlsys.cache import atomic_dir, cache_dir, fingerprint
from rlsys.collector import RolloutCollector
from rlsys.config.loader import to_yaml
from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import TaskSplits, load_task
from rlsys.launch.local import connect_ray, preflight
from rlsys.models.loading import load_tokenizer, resolve_model_path
from rlsys.placement import Roles
from rlsys.run_dir import make_run_dir, write_summary
from rlsys.tracking import Tracker

log = logging.getLogger("rlsys")


def _collector(cfg: TrainConfig, pools, tokenizer) -> RolloutCollector:
    return RolloutCollector.for_task(pools.generate, tokenizer, cfg.task)


def _sft_to(
    cfg: TrainConfig,
    model_path: str,
    out: Path,
    tokenizer,
    task: TaskSplits,
    tracker: Tracker | None,
) -> dict:
    """Run SFT from ``model_path`` on fresh pools and save the result to ``out``."""
    from rlsys.pools import start_pools
    from rlsys.sft import run_sft

    pools = start_pools(cfg, model_path, Roles(), temperature=1.0)
    try:
        result = run_sft(
            cfg.sft,
            pools,
            _collector(cfg, pools, tokenizer),
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


def train(cfg: TrainConfig) -> Path:
    """``rlsys train``: warm start (if enabled), RL, final eval; returns summary.json's path."""
    from rlsys.controller import Controller, save_final_policy
    from rlsys.pools import start_pools

    started = time.perf_counter()
    roles = Roles.for_rl(cfg)
    preflight(cfg, roles)
    run_dir = make_run_dir(cfg, "train")
    log.info("run directory: %s", run_dir)
    connect_ray(cfg, roles)
    base = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(base)
    task = load_task(cfg.task, cfg.run.seed)
    policy_path, warm = base, None
    if cfg.warm_start.enabled:
        policy_path, warm = warm_start(cfg, base, tokenizer, task, run_dir)
    pools = start_pools(cfg, policy_path, roles)
    tracker = Tracker(run_dir, cfg.tracking, run_dir.name, _plain(cfg), cfg.trainer.total_steps)
    try:
        summary = Controller(cfg, pools, tokenizer, task, tracker).run()
        final = save_final_policy(pools, run_dir)
    finally:
        tracker.close()
        pools.shutdown()
    summary.update(
        run_dir=str(run_dir),
        model_path=policy_path,
        final_model=str(final),
        warm_start=warm,
        total_wall_s=time.perf_counter() - started,
    )
    return write_summary(run_dir, summary)


def sft(cfg: TrainConfig) -> Path:
    """``rlsys sft``: supervised fine-tuning; the model lands in ``checkpoints/final``."""
    started = time.perf_counter()
    preflight(cfg, Roles())
    run_dir = make_run_dir(cfg, "sft")
    connect_ray(cfg, Roles())
    base = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(base)
    task = load_task(cfg.task, cfg.run.seed)
    tracker = Tracker(run_dir, cfg.tracking, run_dir.name, _plain(cfg), cfg.sft.max_steps, "sft ")
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


def evaluate(cfg: TrainConfig) -> dict:
    """``rlsys eval``: greedy held-out accuracy of ``model.path`` in this process (no Ray)."""
    from rlsys.engines import ENGINES
    from rlsys.runtime import limit_threads

    limit_threads(cfg.rollout.num_cpus_per_worker)
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path)
    task = load_task(cfg.task, cfg.run.seed)
    engine = ENGINES.get(cfg.rollout.engine)(
        path, cfg.rollout.dtype or cfg.model.dtype, cfg.rollout
    )
    collector = RolloutCollector.for_task(
        lambda prompts, sampling, seed: engine.generate(prompts, sampling), tokenizer, cfg.task
    )
    result = collector.evaluate(
        task.eval[: cfg.eval.num_prompts], cfg.eval.max_new_tokens or task.max_new_tokens
    )
    return {"model": path, **dataclasses.asdict(result)}


def _plain(cfg: TrainConfig) -> dict:
    import yaml

    return yaml.safe_load(to_yaml(cfg))
