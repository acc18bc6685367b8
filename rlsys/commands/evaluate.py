"""``rlsys eval``: greedy held-out accuracy of a model, in this process (no Ray)."""

from __future__ import annotations

import dataclasses

from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import load_task, screen
from rlsys.models.loading import load_tokenizer, resolve_model_path
from rlsys.resolve.inputs import resolve_prompt_limit
from rlsys.trainers.collector import RolloutCollector, check_group_by


def evaluate(cfg: TrainConfig) -> dict:
    """``rlsys eval``: greedy held-out accuracy of ``model.path`` in this process (no Ray)."""
    from rlsys.engines import build_engine
    from rlsys.runtime import limit_threads

    limit_threads(cfg.rollout.num_cpus_per_worker)
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path)
    task = load_task(cfg.task, cfg.run.seed)
    limit = resolve_prompt_limit(cfg, path, task)
    engine = build_engine(path, cfg.rollout.dtype or cfg.model.dtype, cfg.rollout)
    collector = RolloutCollector.for_task(
        lambda prompts, sampling, seed, budgets, images=None: engine.generate(
            prompts, sampling, budgets, images
        ),
        tokenizer,
        cfg.task,
        cfg.reward,
    )
    prompts = screen(
        task.eval[: cfg.eval.num_prompts],
        collector.prompt_length,
        limit,
        "eval",
    )
    check_group_by(cfg.eval.group_by, prompts)
    result = collector.evaluate(
        prompts, cfg.eval.max_new_tokens or task.max_new_tokens, cfg.eval.group_by
    )
    return {"model": path, **dataclasses.asdict(result)}
