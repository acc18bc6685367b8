"""Verifiable tasks: prompts with ground truth, split into train and held-out eval.

The arithmetic family is synthetic and deterministic in the seed, with operands of up to
``digits`` digits (zero-padded to one width with ``pad_operands``). In the ``compact`` style
(for built-in models) a problem reads ``a<op>b=`` and the answer is zero-padded to a fixed
width and, by default, written least-significant digit first (reversed), which a small decoder
learns far more easily. In the ``question`` style (for pretrained chat models) it reads
``What is a <op> b?`` and the answer is the plain decimal value, which the ``last_number``
reward finds at the end of a worked reply.
File tasks read jsonl or parquet rows with configurable prompt and answer columns.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlsys.config.schema import TaskConfig
from rlsys.types import Prompt

log = logging.getLogger(__name__)
QUESTION_MAX_NEW_TOKENS = 64  # question style's default response bound


@dataclass
class TaskSplits:
    """Train and eval prompts of one task, with its default response-length bound."""

    train: list[Prompt]
    eval: list[Prompt]
    max_new_tokens: int
    skipped_rows: int = 0  # malformed file rows left out
    skipped_too_long: int = 0  # prompts over task.max_prompt_tokens left out (screen_prompts)

    def screen_prompts(self, encode) -> TaskSplits:
        """These splits without the prompts ``encode`` (a collector's) rejects as over
        ``task.max_prompt_tokens``, counted, so no step draws a prompt it cannot use."""
        train, _ = encode(self.train)
        evals, _ = encode(self.eval)
        dropped = len(self.train) + len(self.eval) - len(train) - len(evals)
        if not train:
            raise ValueError(
                f"every one of the {len(self.train)} training prompts is longer than "
                "task.max_prompt_tokens; raise it"
            )
        return dataclasses.replace(
            self, train=train, eval=evals, skipped_too_long=self.skipped_too_long + dropped
        )

    def summary(self) -> dict:
        return {
            "train_prompts": len(self.train),
            "eval_prompts": len(self.eval),
            "skipped_malformed_rows": self.skipped_rows,
            "skipped_too_long": self.skipped_too_long,
        }


def _answer_width(op: str, digits: int) -> int:
    return {"+": digits + 1, "-": digits, "*": 2 * digits}[op]


def arithmetic_problem(
    a: int,
    op: str,
    b: int,
    digits: int,
    reverse: bool,
    pad_operands: bool = False,
    style: str = "compact",
) -> tuple[str, str]:
    """The prompt text and answer string of one problem (``style`` as ``task.style``)."""
    if op == "-" and a < b:
        a, b = b, a
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    width = digits if pad_operands else 0
    left, right = f"{a:0{width}d}", f"{b:0{width}d}"
    if style == "question":
        return f"What is {left} {op} {right}?", str(value)
    answer = str(value).zfill(_answer_width(op, digits))
    return f"{left}{op}{right}=", answer[::-1] if reverse else answer


def arithmetic_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Unique problems drawn without replacement; the first ``eval_size`` are held out."""
    space = 10**cfg.digits
    total = len(cfg.operators) * space * space
    wanted = cfg.train_size + cfg.eval_size
    if wanted > total:
        raise ValueError(
            f"task.train_size + task.eval_size = {wanted} exceeds the {total} distinct "
            f"problems with task.digits={cfg.digits} and task.operators={list(cfg.operators)}; "
            "lower the sizes or raise task.digits"
        )
    rng = np.random.default_rng(seed)
    codes = rng.choice(total, size=wanted, replace=False)
    prompts = []
    for uid, code in enumerate(codes.tolist()):
        op_index, rest = divmod(code, space * space)
        a, b = divmod(rest, space)
        op = cfg.operators[op_index]
        text, answer = arithmetic_problem(
            a, op, b, cfg.digits, cfg.reverse_answer, cfg.pad_operands, cfg.style
        )
        prompts.append(Prompt(uid=uid, text=text, answer=answer))
    return TaskSplits(
        train=prompts[cfg.eval_size :],
        eval=prompts[: cfg.eval_size],
        max_new_tokens=cfg.max_new_tokens or _default_max_new_tokens(cfg),
    )


def _default_max_new_tokens(cfg: TaskConfig) -> int:
    """Compact: the answer's digits + EOS. Question: room for a short worked reply (a chat
    model writes "23 + 45 = 68" or a sentence or two; see conf/task/arithmetic_chat.yaml)."""
    if cfg.style == "question":
        return QUESTION_MAX_NEW_TOKENS
    return max(_answer_width(op, cfg.digits) for op in cfg.operators) + 1


def read_rows(path: str, key: str = "task.train_path/eval_path") -> list[dict]:
    """The rows of a .jsonl or .parquet file (``key``: the config key that named it); a
    jsonl line that does not parse becomes ``{}``, for the caller to count as malformed."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"dataset file {path!r} does not exist ({key})")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if p.suffix in (".jsonl", ".json"):
        rows = []
        with p.open() as fh:
            for line in fh:
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        rows.append({})  # counted as malformed below
        return rows
    raise ValueError(f"dataset file {path!r} ({key}): use .jsonl or .parquet")


def _rows_to_prompts(rows: list[dict], cfg: TaskConfig, uid0: int) -> tuple[list[Prompt], int]:
    prompts, skipped = [], 0
    for row in rows:
        text, answer = row.get(cfg.prompt_key), row.get(cfg.answer_key)
        if not isinstance(text, str) or answer is None or isinstance(answer, (dict, list)):
            skipped += 1
            continue
        meta = {k: v for k, v in row.items() if k not in (cfg.prompt_key, cfg.answer_key)}
        prompts.append(Prompt(uid=uid0 + len(prompts), text=text, answer=str(answer), meta=meta))
    return prompts, skipped


def hold_out(rows: list, size: int, seed: int) -> tuple[list, list]:
    """(train, held out): ``size`` random rows held out (at most a fifth of them)."""
    order = np.random.default_rng(seed).permutation(len(rows))
    held = min(size, len(rows) // 5)
    return [rows[i] for i in order[held:]], [rows[i] for i in order[:held]]


def file_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Prompts from jsonl/parquet; without ``eval_path`` the eval split is held out of train."""
    train, skipped = _rows_to_prompts(read_rows(cfg.train_path), cfg, 0)
    if cfg.eval_path:
        evals, more = _rows_to_prompts(read_rows(cfg.eval_path), cfg, len(train))
        skipped += more
    else:
        train, evals = hold_out(train, cfg.eval_size, seed)
    if skipped:
        log.warning(
            "skipped %d malformed dataset rows (missing/invalid %r or %r)",
            skipped,
            cfg.prompt_key,
            cfg.answer_key,
        )
    if not train or not evals:
        raise ValueError(f"dataset {cfg.train_path!r} yielded no usable train or eval rows")
    return TaskSplits(train, evals, cfg.max_new_tokens or 256, skipped)


def synthetic_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Word problems or guessing games for the built-in environments, or review openings
    for the RLHF example."""
    from rlsys.data.reviews import REPLY_TOKENS, review_prompts
    from rlsys.data.word_problems import guess_games, word_problems

    if cfg.name == "reviews":
        train, evals = review_prompts(cfg, seed)
        return TaskSplits(train, evals, cfg.max_new_tokens or REPLY_TOKENS)
    train, evals = (word_problems if cfg.name == "word_problems" else guess_games)(cfg, seed)
    return TaskSplits(train, evals, cfg.max_new_tokens or QUESTION_MAX_NEW_TOKENS)


def load_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """The task named by ``task.name``."""
    if cfg.name == "arithmetic":
        return arithmetic_task(cfg, seed)
    if cfg.name == "file":
        return file_task(cfg, seed)
    return synthetic_task(cfg, seed)
