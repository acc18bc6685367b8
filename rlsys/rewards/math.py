"""Math verifiers (``boxed``, ``math_verify``, ``gsm8k``, ``scratchpad``) and the ``format``
reward.

``metadata["answer"]`` is the ground-truth string (a dataset's answer column, see
``rlsys.data.math_data``). Rewards run on worker threads (``rlsys.rewards.scoring``), so
``math_verify`` is called with its signal-based timeouts disabled (``signal.alarm`` only works
on the main thread); ``reward.timeout_s`` bounds each call instead. math_verify (sympy) is
imported on first use: it takes ~0.6 s, which every importer of ``rlsys.rewards`` would pay.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from rlsys.algorithms.settings import setting
from rlsys.config.errors import ConfigError
from rlsys.data.boxed import last_boxed
from rlsys.rewards.registry import REWARDS, numbers_in, same_number

_NORMALISE = [
    (re.compile(r"\\left|\\right|\\!|\$|\s"), ""),
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"(?<=\d),(?=\d{3}(?!\d))"), ""),  # thousands separators: 1,234,567
]


def normalise_answer(text: str) -> str:
    """``text`` without spaces, ``$``, ``\\left``/``\\right``, ``\\!``, thousands commas and
    trailing periods, with ``\\dfrac``/``\\tfrac`` written ``\\frac``."""
    for pattern, repl in _NORMALISE:
        text = pattern.sub(repl, text)
    return text.rstrip(".")


def same_answer(found: str, answer: str) -> bool:
    """Whether two answers are equal as normalised strings, or as numbers."""
    a, b = normalise_answer(found), normalise_answer(str(answer))
    return a == b or same_number(a, b)


@REWARDS.register("boxed")
def boxed(prompt: str, completion: str, metadata: dict) -> float:
    """1.0 when the last ``\\boxed{}`` of the completion equals the answer (normalised string or
    numeric equality); 0.0 without a box."""
    found = last_boxed(completion)
    return float(found is not None and same_answer(found, metadata["answer"]))


def _parse(text: str) -> list:
    """What math_verify extracts from ``text``: a LaTeX answer (``\\boxed{}`` first, then
    ``$...$`` and anchors like "the answer is"), else a plain expression or number."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    return parse(text, extraction_config=config, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> tuple:
    """The parsed ground truth (cached: every sample of a prompt's group shares it)."""
    text = answer if ("$" in answer or "\\boxed" in answer) else f"${answer}$"
    gold = _parse(text)
    if not gold:
        raise ValueError(
            f"math_verify cannot parse the answer {answer!r}; fix the dataset's answer column "
            "(task.answer_key) or use task.reward=boxed for string answers"
        )
    return tuple(gold)


@REWARDS.register("math_verify")
def math_verify_reward(prompt: str, completion: str, metadata: dict) -> dict:
    """1.0 when math_verify finds the completion's answer mathematically equal to the ground
    truth (``\\frac{1}{2}`` = ``0.5``, ``\\sqrt{2}/2`` = ``\\frac{\\sqrt{2}}{2}``); 0.0 else."""
    from math_verify import verify

    gold = list(_parse_gold(str(metadata["answer"]).strip()))
    pred = _parse(completion)
    correct = bool(pred) and verify(gold, pred, timeout_seconds=None)
    return {"reward": float(correct), "correct": correct}


@dataclass(frozen=True)
class FormatSettings:
    """The pattern the whole completion must match (``re.fullmatch`` with DOTALL)."""

    pattern: str = setting(r"(?s)\s*\S.*", "format_pattern")

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern, re.DOTALL)
        except re.error as exc:
            raise ConfigError(
                f"reward.format_pattern (or reward.args.format.pattern)={self.pattern!r} is not "
                f"a valid regular expression ({exc}); fix it, e.g. "
                "reward.format_pattern='.*\\\\boxed\\{.+\\}\\s*'"
            ) from exc


@REWARDS.register("format", settings=FormatSettings)
def format_reward(prompt: str, completion: str, metadata: dict, s: FormatSettings) -> float:
    """1.0 when the whole completion matches ``reward.format_pattern`` (``re.fullmatch`` with
    DOTALL, so ``.`` spans lines and the pattern must account for the entire reply, e.g.
    ``.*\\\\boxed\\{.+\\}\\s*``: ends with a boxed answer); 0.0 otherwise."""
    return float(re.fullmatch(s.pattern, completion, re.DOTALL) is not None)


@REWARDS.register("gsm8k")
def gsm8k(prompt: str, completion: str, metadata: dict) -> float:
    """1.0 when the completion's final answer equals the numeric answer: the first number
    after the last ``####`` if there is one (GSM8K's answer marker), else the last number."""
    if "####" in completion:
        numbers = numbers_in(completion.rsplit("####", 1)[1])[:1]
    else:
        numbers = numbers_in(completion)[-1:]
    return float(bool(numbers) and same_number(numbers[0], metadata["answer"]))


_MARKED = re.compile(r"#\s*(-?\d+)\s*")


def marked_answer(text: str) -> str | None:
    """The number after the last ``#`` of ``text`` when nothing else follows it
    (``"23+45=68;68+17=85;#85"`` -> ``"85"``), else None (no marker, or not a bare number
    after it)."""
    _, marker, tail = text.rpartition("#")
    match = _MARKED.fullmatch(marker + tail) if marker else None
    return match.group(1) if match else None


@REWARDS.register("scratchpad")
def scratchpad(prompt: str, completion: str, metadata: dict) -> float:
    """1.0 when the completion's marked final answer (``marked_answer``) equals the
    reference's: the worked steps before it are not checked, and a reply without a final
    ``#<number>`` scores 0.0. ``metadata["answer"]`` is the reference's worked reply
    (task ``arithmetic_scratchpad``) or its bare final number."""
    reference = marked_answer(str(metadata["answer"])) or str(metadata["answer"]).strip()
    found = marked_answer(completion)
    return float(found is not None and same_number(found, reference))
