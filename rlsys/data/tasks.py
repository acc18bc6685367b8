"""Verifiable tasks: prompts with ground truth, split into train and held-out eval.

The arithmetic family is synthetic and deterministic in the seed, with operands of up to
``digits`` digits (zero-padded to one width with ``pad_operands``). In the ``compact`` style
(for built-in models) a problem reads ``a<op>b=`` and the answer is zero-padded to a fixed
width and, by default, written least-significant digit first (reversed), which a small decoder
learns far more easily. In the ``question`` style (for pretrained chat models) it reads
``What is a <op> b?`` and the answer is the plain decimal value, which the ``last_number``
reward finds at the end of a worked reply. ``arithmetic_scratchpad`` chains 3-4 additions
and answers with the worked steps ("23+45=68;68+17=85;#85"): long replies decided late.
File tasks read jsonl or parquet rows (rlsys/data/rows.py) with configurable prompt and answer
columns.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.data.columns import answer_of, prompt_of
from rlsys.data.rows import read_rows
from rlsys.registry import Registry
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

    def screen_prompts(self, length: Callable[[Prompt], int], limit: int) -> TaskSplits:
        """These splits without the prompts over ``limit`` tokens (``task.max_prompt_tokens``;
        ``length``: a prompt's token count as the collector formats it), counted and warned
        about per split, so no step draws a prompt it cannot use."""
        train = screen(self.train, length, limit, "train")
        evals = screen(self.eval, length, limit, "eval")
        dropped = len(self.train) + len(self.eval) - len(train) - len(evals)
        if not train:
            raise ConfigError(
                f"every one of the {len(self.train)} training prompts is longer than "
                f"task.max_prompt_tokens={limit}; raise it"
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


def screen(
    prompts: list[Prompt], length: Callable[[Prompt], int], limit: int, split: str
) -> list[Prompt]:
    """``prompts`` (of the ``split`` split) of at most ``limit`` tokens (``length``: a
    prompt's token count as formatted); when some are longer, a warning says how many of how
    many, the longest, and the key to raise. The prompts come back as they were (a VL prompt's
    images are processed again when it is drawn, not held for every prompt)."""
    lengths = [length(p) for p in prompts]
    kept = [p for p, n in zip(prompts, lengths, strict=True) if n <= limit]
    if len(kept) < len(prompts):
        log.warning(
            "%d of %d %s prompts are longer than task.max_prompt_tokens=%d and left out (the "
            "longest has %d tokens); raise task.max_prompt_tokens to keep them (null: what the "
            "model's context leaves after the response bound)",
            len(prompts) - len(kept),
            len(prompts),
            split,
            limit,
            max(lengths),
        )
    return kept


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


def level(a: int, op: str, b: int) -> str:
    """A problem's difficulty class: its operator and how many column carries (``+``),
    borrows (``-``) or nonzero digits of the smaller factor (``*``) it takes, e.g. "+2". The
    curriculum can pool pass-rate estimates by it (``data.curriculum.bucket_key=level``)."""
    if op == "-" and a < b:
        a, b = b, a
    if op == "*":
        return f"*{sum(d != '0' for d in str(min(a, b)))}"
    count, carry = 0, 0
    while a or b:
        x, y = a % 10, b % 10
        carry = int(x + y + carry >= 10) if op == "+" else int(x - y - carry < 0)
        count += carry
        a, b = a // 10, b // 10
    return f"{op}{count}"


# ``task.name`` -> (task config, seed) -> its train and eval splits. A new task is one
# function and its registration line (docs/extending.md).
TaskBuilder = Callable[[TaskConfig, int], "TaskSplits"]
TASKS: Registry[TaskBuilder] = Registry("task", "task.name")


@TASKS.register("arithmetic")
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
        prompts.append(Prompt(uid=uid, text=text, answer=answer, meta={"level": level(a, op, b)}))
    return TaskSplits(
        train=prompts[cfg.eval_size :],
        eval=prompts[: cfg.eval_size],
        max_new_tokens=cfg.max_new_tokens or _default_max_new_tokens(cfg),
    )


def scratchpad_problem(operands: list[int]) -> tuple[str, str]:
    """The prompt and worked reply of one chain sum: "23+45+17=" -> "23+45=68;68+17=85;#85"
    (each step restates its two terms and writes their sum; the final answer follows "#")."""
    total, steps = operands[0], []
    for term in operands[1:]:
        steps.append(f"{total}+{term}={total + term};")
        total += term
    return "+".join(map(str, operands)) + "=", "".join(steps) + f"#{total}"


def chain_level(operands: list[int]) -> str:
    """A chain sum's difficulty class: its operand count and the column carries of its
    steps, e.g. "3:2" (``eval.group_by=level``, the curriculum's ``bucket_key=level``)."""
    carries, total = 0, operands[0]
    for term in operands[1:]:
        carries += int(level(total, "+", term)[1:])
        total += term
    return f"{len(operands)}:{carries}"


@TASKS.register("arithmetic_scratchpad")
def arithmetic_scratchpad_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Sums of ``task.operand_counts`` operands of up to ``task.digits`` digits, answered
    with a worked scratchpad (``scratchpad_problem``): the answer is the whole worked reply
    (what the warm start imitates); the ``scratchpad`` reward scores only its final number.
    Unique problems; the first ``eval_size`` are held out."""
    if list(cfg.operators) != ["+"]:
        raise ConfigError(
            f"task.operators={list(cfg.operators)}: task.name=arithmetic_scratchpad adds chains "
            "of numbers; set task.operators=['+']"
        )
    space, wanted = 10**cfg.digits, cfg.train_size + cfg.eval_size
    total = sum(space**count for count in cfg.operand_counts)
    if wanted > total // 2:  # rejection sampling below needs room
        raise ValueError(
            f"task.train_size + task.eval_size = {wanted} is over half the {total} distinct "
            f"problems with task.digits={cfg.digits} and task.operand_counts="
            f"{list(cfg.operand_counts)}; lower the sizes or raise task.digits"
        )
    rng = np.random.default_rng(seed)
    seen: set[tuple[int, ...]] = set()
    prompts = []
    while len(prompts) < wanted:
        count = int(rng.choice(cfg.operand_counts))
        operands = tuple(int(x) for x in rng.integers(0, space, size=count))
        if operands in seen:
            continue
        seen.add(operands)
        text, reply = scratchpad_problem(list(operands))
        meta = {"level": chain_level(list(operands))}
        prompts.append(Prompt(uid=len(prompts), text=text, answer=reply, meta=meta))
    longest = scratchpad_problem([space - 1] * max(cfg.operand_counts))[1]
    return TaskSplits(
        train=prompts[cfg.eval_size :],
        eval=prompts[: cfg.eval_size],
        max_new_tokens=cfg.max_new_tokens or len(longest) + 1,  # + EOS
    )


def _default_max_new_tokens(cfg: TaskConfig) -> int:
    """Compact: the answer's digits + EOS. Question: room for a short worked reply (a chat
    model writes "23 + 45 = 68" or a sentence or two; see conf/task/arithmetic_chat.yaml)."""
    if cfg.style == "question":
        return QUESTION_MAX_NEW_TOKENS
    return max(_answer_width(op, cfg.digits) for op in cfg.operators) + 1


def _no_usable_rows(key: str, path: str, rows: list[dict], needed: list[str]) -> ConfigError:
    """The error for a file none of whose rows has the columns the config names."""
    columns = sorted({column for row in rows for column in row})
    return ConfigError(
        f"{key}={path!r}: none of its {len(rows)} rows has usable {needed} columns; its "
        f"columns are {columns}. Set the column keys (e.g. task.prompt_key, task.answer_key) "
        "to the file's, or fix the file"
    )


def _rows_to_prompts(rows: list[dict], cfg: TaskConfig, uid0: int) -> tuple[list[Prompt], int]:
    prompts, skipped = [], 0
    for row in rows:
        (text, messages), answer = prompt_of(row, cfg.prompt_key), answer_of(row, cfg.answer_key)
        if text is None or answer is None or isinstance(answer, (dict, list)):
            skipped += 1
            continue
        meta = {
            k: v for k, v in row.items() if k not in (cfg.prompt_key, cfg.answer_key, cfg.image_key)
        }
        images = row.get(cfg.image_key) if cfg.image_key else None
        if cfg.image_key and images is None:
            skipped += 1
            continue
        images = [] if images is None else list(images) if isinstance(images, list) else [images]
        prompts.append(
            Prompt(
                uid=uid0 + len(prompts),
                text=text,
                answer=str(answer),
                meta=meta,
                images=images,
                messages=messages,
            )
        )
    return prompts, skipped


def hold_out(rows: list, size: int, seed: int) -> tuple[list, list]:
    """(train, held out): ``size`` random rows held out (at most a fifth of them)."""
    order = np.random.default_rng(seed).permutation(len(rows))
    held = min(size, len(rows) // 5)
    return [rows[i] for i in order[held:]], [rows[i] for i in order[:held]]


@TASKS.register("file")
def file_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Prompts from jsonl/parquet; without ``eval_path`` the eval split is held out of train."""
    rows = read_rows(cfg.train_path, "task.train_path")
    train, skipped = _rows_to_prompts(rows, cfg, 0)
    needed = [cfg.prompt_key, cfg.answer_key]
    if not train:
        raise _no_usable_rows("task.train_path", cfg.train_path, rows, needed)
    if cfg.eval_path:
        eval_rows = read_rows(cfg.eval_path, "task.eval_path")
        evals, more = _rows_to_prompts(eval_rows, cfg, len(train))
        skipped += more
        if not evals:
            raise _no_usable_rows("task.eval_path", cfg.eval_path, eval_rows, needed)
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
        raise ConfigError(
            f"task.train_path={cfg.train_path!r} has {len(train) + len(evals)} usable rows: "
            "too few to hold out an eval split (a fifth at most); add rows or set task.eval_path"
        )
    return TaskSplits(train, evals, cfg.max_new_tokens or 256, skipped)


@TASKS.register("shapes")
def shapes_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Count the shapes of one colour in a rendered picture (rlsys.data.shapes); a VL model."""
    from rlsys.data.shapes import shape_splits

    train, evals = shape_splits(cfg.shapes, cfg.train_size, cfg.eval_size, seed)
    return TaskSplits(train, evals, cfg.max_new_tokens or 2)


@TASKS.register("word_problems")
def word_problem_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """One-step word problems for the calculator environment (and as plain questions)."""
    from rlsys.data.word_problems import word_problems

    return TaskSplits(*word_problems(cfg, seed), cfg.max_new_tokens or QUESTION_MAX_NEW_TOKENS)


@TASKS.register("guess_number")
def guess_number_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Guess-the-number games for the guess_number environment."""
    from rlsys.data.word_problems import guess_games

    return TaskSplits(*guess_games(cfg, seed), cfg.max_new_tokens or QUESTION_MAX_NEW_TOKENS)


@TASKS.register("sql")
def sql_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Questions about a small company database for the sql environment (one per database)."""
    from rlsys.data.sql_questions import sql_questions

    return TaskSplits(*sql_questions(cfg, seed), cfg.max_new_tokens or QUESTION_MAX_NEW_TOKENS)


@TASKS.register("search")
def search_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """One- and two-hop questions about a made-up world for the search environment."""
    from rlsys.data.kb_questions import kb_questions

    return TaskSplits(*kb_questions(cfg, seed), cfg.max_new_tokens or QUESTION_MAX_NEW_TOKENS)


@TASKS.register("reviews")
def reviews_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """Review openings for the RLHF example (a hidden labeller scores the replies)."""
    from rlsys.data.reviews import REPLY_TOKENS, review_prompts

    return TaskSplits(*review_prompts(cfg, seed), cfg.max_new_tokens or REPLY_TOKENS)


def load_task(cfg: TaskConfig, seed: int) -> TaskSplits:
    """The task named by ``task.name``, its problems and split drawn with ``task.split_seed``,
    or with ``seed`` (the run's) when that is null."""
    return TASKS.get(cfg.name)(cfg, seed if cfg.split_seed is None else cfg.split_seed)
