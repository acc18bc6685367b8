"""What the commands share before they train: the program's inputs (the model directory, its
tokenizer, the task's splits) checked and screened before a run directory or Ray exists, the
rollout collector over a run's pools, and the config as plain data for the trackers."""

from __future__ import annotations

import logging

from rlsys.config.loader import to_yaml
from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import load_task
from rlsys.models.loading import check_model_path, load_tokenizer, resolve_model_path
from rlsys.resolve.inputs import check_splits, resolve_prompt_limit
from rlsys.run.directory import check_output_dir
from rlsys.trainers.collector import RolloutCollector

log = logging.getLogger("rlsys")


def rollout_collector(cfg: TrainConfig, pools, tokenizer) -> RolloutCollector:
    """The task's collector, generating on ``pools``."""
    return RolloutCollector.for_task(pools.generate, tokenizer, cfg.task, cfg.reward)


def program_inputs(cfg: TrainConfig, rl: bool = True):
    """The model directory, its tokenizer and the task's splits without prompts too long to
    use: every input checked (the model path, the dataset files and, for RL (``rl``), the
    batch size and the validation prompts against the splits) before a run directory or Ray
    exists."""
    check_output_dir(cfg)
    check_model_path(cfg.model.path)
    task = load_task(cfg.task, cfg.run.seed)  # dataset errors first: they need no model
    if rl:
        check_splits(cfg, task)  # before screening too: the tokenizer takes seconds to load
    base = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(base)
    limit = resolve_prompt_limit(cfg, base, task)
    collector = RolloutCollector.for_task(None, tokenizer, cfg.task, cfg.reward)
    task = task.screen_prompts(collector.prompt_length, limit)
    info = task.summary()
    log.info(
        "dataset: %d train / %d eval prompts; skipped %d malformed rows and %d prompts over "
        "task.max_prompt_tokens=%d",
        info["train_prompts"],
        info["eval_prompts"],
        info["skipped_malformed_rows"],
        info["skipped_too_long"],
        limit,
    )
    if rl:
        check_splits(cfg, task)
    return base, tokenizer, task


def plain_config(cfg: TrainConfig) -> dict:
    """``cfg`` as plain YAML data (what the trackers record)."""
    import yaml

    return yaml.safe_load(to_yaml(cfg))
