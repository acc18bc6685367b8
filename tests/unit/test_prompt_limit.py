"""task.max_prompt_tokens: prompts left out for length are warned about (how many of how many
of which split, the longest, the key), and null takes the bound from the model's context less
the response bound, resolved once by the command; explicit values (presets) stay."""

from __future__ import annotations

import logging

import pytest

from rlsys.commands.evaluate import evaluate
from rlsys.config.errors import ConfigError
from rlsys.data.tasks import TaskSplits, load_task, screen
from rlsys.models.loading import context_length, load_tokenizer
from rlsys.resolve import load_config
from rlsys.resolve.inputs import resolve_prompt_limit
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import Prompt


def _prompts(*texts: str) -> list[Prompt]:
    return [Prompt(uid=i, text=t, answer="1") for i, t in enumerate(texts)]


def _chars(prompt: Prompt) -> int:
    return len(prompt.text)


def test_dropped_prompts_are_warned_about_per_split(caplog):
    train, evals = _prompts("1+1=", "22+22=", "333+333="), _prompts("4=", "55555+1=", "1=")
    splits = TaskSplits(train, evals, max_new_tokens=4)
    with caplog.at_level(logging.WARNING):
        kept = splits.screen_prompts(_chars, 6)
    assert [p.text for p in kept.train] == ["1+1=", "22+22="]
    assert [p.text for p in kept.eval] == ["4=", "1="]
    assert kept.skipped_too_long == 2
    lines = [r.getMessage() for r in caplog.records]
    assert any("1 of 3 train prompts" in m and "longest has 8 tokens" in m for m in lines), lines
    assert any("1 of 3 eval prompts" in m and "task.max_prompt_tokens=6" in m for m in lines)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert screen(train, _chars, 8, "train") == train
    assert not caplog.records  # nothing dropped, nothing said


def test_null_takes_the_models_context_less_the_response_bound(tiny_model_dir):
    cfg = load_config([])
    assert cfg.task.max_prompt_tokens is None
    task = load_task(cfg.task, cfg.run.seed)
    assert context_length(tiny_model_dir) == cfg.model.max_position_embeddings == 256
    assert resolve_prompt_limit(cfg, tiny_model_dir, task) == 256 - task.max_new_tokens
    assert cfg.task.max_prompt_tokens == 252  # resolved once, in the config every reader has
    # the default job's prompts ("99+99=") are nowhere near it, nor the old default of 64
    assert max(len(p.text) for p in task.train + task.eval) <= 6
    # a longer eval reply, a multi-turn trajectory, a shorter vLLM context all count
    cfg = load_config(["eval.max_new_tokens=50"])
    assert resolve_prompt_limit(cfg, tiny_model_dir, task) == 206
    cfg = load_config(["task=guess_number"])
    game = load_task(cfg.task, 0)
    assert resolve_prompt_limit(cfg, tiny_model_dir, game) == 256 - 64  # env.max_total_tokens
    cfg = load_config(["rollout.engine=vllm", "rollout.vllm.max_model_len=100"])
    assert resolve_prompt_limit(cfg, tiny_model_dir, task) == 96


def test_explicit_values_stay_and_no_room_names_the_keys(tiny_model_dir, tiny_vl_dir):
    cfg = load_config(["task=gsm8k"])
    assert cfg.task.max_prompt_tokens == 256  # the preset's
    assert resolve_prompt_limit(cfg, tiny_model_dir, TaskSplits([], [], 512)) == 256
    cfg = load_config(["task.max_new_tokens=300"])
    with pytest.raises(ConfigError, match=r"task\.max_prompt_tokens.*task\.max_new_tokens"):
        resolve_prompt_limit(cfg, tiny_model_dir, load_task(cfg.task, 0))
    assert context_length(tiny_vl_dir) == 256  # a VL model's, from its text config


def test_prompts_dropped_while_running_are_warned_about_once(tiny_model_dir, caplog):
    cfg = load_config(["task.max_prompt_tokens=5"])
    collector = RolloutCollector.for_task(None, load_tokenizer(tiny_model_dir), cfg.task)
    with caplog.at_level(logging.WARNING):
        kept, ids = collector.encode(_prompts("1+1=", "123+456=", "12+3456="))
        collector.encode(_prompts("123+456="))
    assert [p.text for p in kept] == ["1+1="] and collector.skipped_prompts == 3
    warnings = [r.getMessage() for r in caplog.records if "max_prompt_tokens" in r.getMessage()]
    assert len(warnings) == 1 and "2 of 3 prompts" in warnings[0], warnings
    assert "longest has 8 tokens" in warnings[0]


def test_eval_names_the_eval_prompts_it_leaves_out(tiny_model_dir, caplog):
    """``rlsys eval`` (no screening at start): a split that loses prompts says so."""
    cfg = load_config(["task.max_prompt_tokens=5", "eval.num_prompts=20"])
    with caplog.at_level(logging.WARNING):
        result = evaluate(cfg)
    task = load_task(cfg.task, cfg.run.seed)
    long = sum(len(p.text) > 5 for p in task.eval[:20])
    assert 0 < long < 20 and result["num_prompts"] == 20 - long
    assert f"{long} of 20 eval prompts" in caplog.text
