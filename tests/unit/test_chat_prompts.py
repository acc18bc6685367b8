"""Prompt formatting for chat models: chat template, instruction, system turn, and their checks."""

from __future__ import annotations

import pytest

from rlsys.config import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.data.tasks import QUESTION_MAX_NEW_TOKENS, arithmetic_problem, load_task
from rlsys.models.loading import load_tokenizer
from rlsys.resolve import load_config
from rlsys.rewards import REWARDS
from rlsys.trainers.collector import PromptFormat, RolloutCollector
from rlsys.types import Prompt

# A ChatML-like template small enough to read; the char tokenizer covers every character in it.
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _no_generate(prompts, sampling, seed):
    raise AssertionError("not called")


@pytest.fixture
def chat_tokenizer(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    tok.chat_template = TEMPLATE
    return tok


def _collector(tokenizer, **task) -> RolloutCollector:
    """A collector for ``TaskConfig(**task)``; char tokens are many, so prompts may be long."""
    task.setdefault("max_prompt_tokens", 256)
    return RolloutCollector.for_task(_no_generate, tokenizer, TaskConfig(**task))


def _encoded_as(collector: RolloutCollector, text: str, expected: str) -> bool:
    """Whether ``text`` renders to ``expected`` and is encoded as exactly its tokens."""
    kept, ids = collector.encode([Prompt(uid=0, text=text, answer="1")])
    tokens = collector.tokenizer.encode(expected, add_special_tokens=False)
    rendered = collector.prompt_format.render(text, collector.tokenizer)
    return len(kept) == 1 and ids == [tokens] and rendered == expected


def test_default_format_is_the_bare_text(chat_tokenizer):
    collector = _collector(chat_tokenizer)
    _, ids = collector.encode([Prompt(uid=0, text="12+34=", answer="64")])
    assert ids == [chat_tokenizer.encode("12+34=", add_special_tokens=False)]


def test_chat_template_wraps_the_prompt_and_instruction_as_the_user_turn(chat_tokenizer):
    collector = _collector(chat_tokenizer, chat_template=True, instruction="End with the number.")
    expected = "<user>What is 2 + 3?\n\nEnd with the number.</>\n<assistant>"
    assert _encoded_as(collector, "What is 2 + 3?", expected)


def test_system_prompt_becomes_the_first_turn(chat_tokenizer):
    collector = _collector(chat_tokenizer, chat_template=True, system_prompt="Be brief.")
    assert _encoded_as(collector, "Hi?", "<system>Be brief.</>\n<user>Hi?</>\n<assistant>")


def test_instruction_without_chat_template_is_appended(chat_tokenizer):
    collector = _collector(chat_tokenizer, instruction="Answer:")
    assert _encoded_as(collector, "What is 2 + 3?", "What is 2 + 3?\n\nAnswer:")


def test_the_formatted_prompt_counts_against_max_prompt_tokens(chat_tokenizer):
    fmt = PromptFormat(instruction="x" * 40, chat_template=True)
    collector = RolloutCollector(_no_generate, chat_tokenizer, None, 50, fmt)
    kept, ids = collector.encode([Prompt(uid=0, text="1+1", answer="2")])
    assert kept == [] and ids == [] and collector.skipped_prompts == 1


def test_the_builtin_tokenizer_has_the_template_above(tiny_model_dir):
    assert load_tokenizer(tiny_model_dir).chat_template == TEMPLATE


def test_chat_template_needs_a_tokenizer_with_one(tiny_model_dir):
    plain = load_tokenizer(tiny_model_dir)
    plain.chat_template = None  # as a base model's
    with pytest.raises(ConfigError, match="task.chat_template"):
        _collector(plain, chat_template=True)


def test_for_task_takes_the_reward_from_the_task(chat_tokenizer):
    collector = _collector(chat_tokenizer, reward="last_number")
    [verifier] = collector.scorer.components
    assert verifier.fn is REWARDS.get("last_number") and verifier.verdict
    with pytest.raises(ConfigError, match="task.reward"):
        _collector(chat_tokenizer, reward="nope")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["task.style=essay"], "task.style"),
        (["task.style=question"], "task.reverse_answer"),
        (["task.system_prompt=Be brief."], "task.system_prompt"),
        (["task.instruction= "], "task.instruction"),
        (["task.chat_template=true", "task.system_prompt= "], "task.system_prompt"),
        (["task.chatt_template=true"], "did you mean 'task.chat_template'"),
    ],
)
def test_bad_prompt_keys_name_the_key(overrides, needle):
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    assert needle in str(info.value)


def test_question_style_reads_as_a_question_with_a_plain_answer():
    assert arithmetic_problem(46, "+", 78, 2, False, style="question") == (
        "What is 46 + 78?",
        "124",
    )
    assert arithmetic_problem(3, "-", 40, 2, False, style="question") == ("What is 40 - 3?", "37")
    task = load_task(TaskConfig(style="question", reverse_answer=False), seed=0)
    assert task.max_new_tokens == QUESTION_MAX_NEW_TOKENS
    assert all(p.text.startswith("What is ") and p.answer.isdigit() for p in task.eval)


def test_compact_style_is_unchanged_by_default():
    task = load_task(TaskConfig(), seed=0)
    assert task.max_new_tokens == 4
    assert all(p.text.endswith("=") and len(p.answer) == 3 for p in task.eval)


def test_chat_task_preset_composes_with_the_smollm2_model_preset():
    cfg = load_config(["model=smollm2-135m", "task=arithmetic_chat"])
    assert cfg.model.path == "gguf:smollm2-135m-instruct"
    assert cfg.task.chat_template and cfg.task.style == "question" and cfg.task.instruction
