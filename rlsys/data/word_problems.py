"""Synthetic prompts for the built-in environments: arithmetic word problems (the calculator
tool) and guess-the-number games. Deterministic in the seed; the first ``eval_size`` are
held out."""

from __future__ import annotations

import numpy as np

from rlsys.config.schema import TaskConfig
from rlsys.types import Prompt

NAMES = ["Ann", "Bob", "Cy", "Dee", "Eli", "Fay", "Gus", "Ivy"]
ITEMS = ["pens", "cards", "eggs", "beads", "coins", "shells"]
TEMPLATES = {
    "+": "{name} has {a} {item} and gets {b} more. How many {item} now?",
    "-": "{name} has {a} {item} and gives away {b}. How many {item} are left?",
    "*": "{name} buys {a} bags of {b} {item}. How many {item} in all?",
}


def word_problem(name: str, item: str, a: int, op: str, b: int) -> Prompt:
    """One problem; ``meta["expression"]`` is the calculation that solves it."""
    if op == "-" and a < b:
        a, b = b, a
    expression = f"{a}{op}{b}"
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    text = TEMPLATES[op].format(name=name, item=item, a=a, b=b)
    return Prompt(uid=0, text=text, answer=str(value), meta={"expression": expression})


def word_problems(cfg: TaskConfig, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """Unique problems with operands of 1..``task.digits`` digits and ``task.operators``."""
    rng = np.random.default_rng(seed)
    wanted = cfg.train_size + cfg.eval_size
    top = 10**cfg.digits
    seen: set[str] = set()
    prompts: list[Prompt] = []
    for _ in range(wanted * 20):
        if len(prompts) == wanted:
            break
        p = word_problem(
            NAMES[rng.integers(len(NAMES))],
            ITEMS[rng.integers(len(ITEMS))],
            int(rng.integers(1, top)),
            cfg.operators[rng.integers(len(cfg.operators))],
            int(rng.integers(1, top)),
        )
        if p.text not in seen:
            seen.add(p.text)
            p.uid = len(prompts)
            prompts.append(p)
    return prompts[cfg.eval_size :], prompts[: cfg.eval_size]


def guess_games(cfg: TaskConfig, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """Games over 1..10**task.digits; the secret is the answer (games repeat: the secret
    space is small, so train and eval share secrets but not prompts' uids)."""
    rng = np.random.default_rng(seed)
    high = 10**cfg.digits
    text = f"Guess my number from 1 to {high}."
    prompts = [
        Prompt(uid, text, str(int(rng.integers(1, high + 1))), {"low": 1, "high": high})
        for uid in range(cfg.train_size + cfg.eval_size)
    ]
    return prompts[cfg.eval_size :], prompts[: cfg.eval_size]
