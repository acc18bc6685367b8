"""The config against a program's inputs: the prompt bound a null ``task.max_prompt_tokens``
takes from the model's context, ``data.batch_size`` against the task's training split and
``eval.validation_prompts`` against its held-out split. All run once, before a run directory
or Ray exists."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.data.tasks import TaskSplits
from rlsys.models.loading import context_length

log = logging.getLogger("rlsys")


def resolve_prompt_limit(cfg: TrainConfig, model_path: str, task: TaskSplits) -> int:
    """``task.max_prompt_tokens``, set where it is null (once, before anything reads it) to
    the context of the model at ``model_path`` (at most ``rollout.vllm.max_model_len`` with
    vLLM) less the longest response the run may generate. ConfigError when that leaves no
    room, or the model's config states no context."""
    if cfg.task.max_prompt_tokens is not None:
        return cfg.task.max_prompt_tokens
    context = context_length(model_path)
    if cfg.rollout.engine == "vllm" and cfg.rollout.vllm.max_model_len:
        context = min(context or cfg.rollout.vllm.max_model_len, cfg.rollout.vllm.max_model_len)
    response = max(task.max_new_tokens, cfg.eval.max_new_tokens or 0)
    if cfg.task.env.name is not None:  # a prompt is followed by a whole trajectory
        response = cfg.task.env.total_tokens(response)
    if context is None or context <= response:
        why = (
            f"its context ({context} positions) leaves no room after {response} response tokens"
            if context
            else "its config.json states no max_position_embeddings"
        )
        raise ConfigError(
            f"task.max_prompt_tokens=null takes the prompt bound from model {model_path}, but "
            f"{why}; set task.max_prompt_tokens, or lower task.max_new_tokens"
        )
    cfg.task.max_prompt_tokens = context - response
    log.info(
        "task.max_prompt_tokens=null: %d (the model's %d positions less %d response tokens)",
        context - response,
        context,
        response,
    )
    return context - response


def check_splits(cfg: TrainConfig, task: TaskSplits) -> None:
    """Refuse a batch or a validation split larger than the task's splits can give."""
    check_batch(cfg, task)
    validation_split(task.eval, cfg.eval.num_prompts, cfg.eval.validation_prompts)


def check_batch(cfg: TrainConfig, task: TaskSplits) -> None:
    """Refuse a ``data.batch_size`` larger than the task's usable training prompts."""
    if cfg.data.batch_size > len(task.train):
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size} exceeds the {len(task.train)} usable "
            "training prompts of the task; lower data.batch_size or use a larger dataset"
        )


def validation_split(held_out: Sequence, num_prompts: int, validation_prompts: int) -> list:
    """The ``validation_prompts`` held-out prompts after the first ``num_prompts`` (the
    reported ones); raises ``ConfigError`` when the task holds out too few."""
    wanted = num_prompts + validation_prompts
    if len(held_out) < wanted:
        raise ConfigError(
            f"eval.validation_prompts={validation_prompts} needs {wanted} held-out prompts "
            f"(eval.num_prompts={num_prompts} + {validation_prompts}), but the task holds "
            f"out {len(held_out)}: "
            "raise task.eval_size (or give a longer task.eval_path), or lower "
            "eval.validation_prompts / eval.num_prompts"
        )
    return list(held_out[num_prompts:wanted])
