"""Questions for the ``sql`` task (``task=sql``): each prompt has its own database
(``meta["db"]``, a seed of ``rlsys/data/sql_world.py``), a question from a template, and the
reference query that answers it (``meta["query"]``). The answer is the reference query's
result as the ``sql`` tool prints it, so a model that runs the right query and copies the
result is right. Deterministic in the seed; eval databases and train databases are disjoint
(eval takes the first ``eval_size`` seeds of the range of ``task.split_seed``, or of the run
seed, train the rest).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlsys.config.schema import TaskConfig
from rlsys.data.sql_tool import SQLDatabase
from rlsys.data.sql_world import Company, company
from rlsys.types import Prompt

SEEDS_PER_RUN = 10_000_000  # database seeds of run seed s: s*SEEDS_PER_RUN + index

# template name -> (level, question, reference query, which values fill the blank)
TEMPLATES: dict[str, tuple[int, str, str, Callable[[Company], list[str]]]] = {
    "count": (
        1,
        "How many people work in {x}?",
        "SELECT COUNT(*) FROM emp WHERE dept='{x}'",
        lambda c: sorted({d for _, d, _ in c.emp}),
    ),
    "pay": (
        1,
        "What does {x} earn?",
        "SELECT pay FROM emp WHERE name='{x}'",
        lambda c: [n for n, _, _ in c.emp],
    ),
    "leads": (
        1,
        "Which projects does {x} lead?",
        "SELECT name FROM proj WHERE lead='{x}'",
        lambda c: sorted({lead for _, lead in c.proj}),
    ),
    "staff": (
        2,
        "Who works in {x}?",
        "SELECT name FROM emp WHERE dept='{x}'",
        lambda c: sorted({d for _, d, _ in c.emp}),
    ),
    "top": (
        2,
        "Who earns the most in {x}?",
        "SELECT name FROM emp WHERE dept='{x}' ORDER BY pay DESC LIMIT 1",
        lambda c: sorted({d for _, d, _ in c.emp}),
    ),
    "lead_dept": (
        3,
        "Which dept is the lead of {x} in?",
        "SELECT dept FROM emp WHERE name=(SELECT lead FROM proj WHERE name='{x}')",
        lambda c: [p for p, _ in c.proj],
    ),
}


def sql_question(db_seed: int, template: str, rng: np.random.Generator) -> Prompt:
    """A question of ``template`` about database ``db_seed``, answered by running its
    reference query there."""
    level, question, query, choices = TEMPLATES[template]
    options = choices(company(db_seed))
    x = options[rng.integers(len(options))]
    query = query.format(x=x)
    reply = SQLDatabase.from_seed(db_seed).run(query)
    if reply.error:  # a template bug, not a model error
        raise RuntimeError(f"reference query {query!r} failed: {reply.text}")
    meta = {"db": db_seed, "query": query, "level": level, "template": template}
    return Prompt(uid=0, text=question.format(x=x), answer=reply.text, meta=meta)


def sql_questions(cfg: TaskConfig, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, eval): one question per database, templates drawn uniformly."""
    rng = np.random.default_rng(seed)
    names = sorted(TEMPLATES)
    prompts = []
    for index in range(cfg.train_size + cfg.eval_size):
        template = names[rng.integers(len(names))]
        prompt = sql_question(seed * SEEDS_PER_RUN + index, template, rng)
        prompt.uid = index
        prompts.append(prompt)
    return prompts[cfg.eval_size :], prompts[: cfg.eval_size]
