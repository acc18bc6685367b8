"""Questions for the ``search`` task (``task=search``): each prompt has its own knowledge base
(``meta["kb"]``, a seed of ``rlsys/data/kb_world.py``) and a one- or two-hop question about it
(``meta["hops"]``), with the searches that answer it (``meta["searches"]``: the first is
fixed, a second one names the first hop's answer). Deterministic in the seed; eval worlds and
train worlds are disjoint (eval takes the first ``eval_size`` seeds of the run's range).
"""

from __future__ import annotations

import numpy as np

from rlsys.config.schema import TaskConfig
from rlsys.data.kb_world import World, world
from rlsys.types import Prompt

SEEDS_PER_RUN = 10_000_000  # world seeds of run seed s: s*SEEDS_PER_RUN + index

# question -> the hops: (relation, search word) per hop; relations are World fields
TEMPLATES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "Where was {x} born?": ("person", [("born", "born")]),
    "Where does {x} work?": ("person", [("works", "works")]),
    "Who founded {x}?": ("company", [("founder", "founded")]),
    "Where is {x} based?": ("company", [("based", "based")]),
    "Where was the founder of {x} born?": ("company", [("founder", "founded"), ("born", "born")]),
    "Where is the employer of {x} based?": ("person", [("works", "works"), ("based", "based")]),
    "Who founded the employer of {x}?": ("person", [("works", "works"), ("founder", "founded")]),
}


def kb_question(kb_seed: int, template: str, rng: np.random.Generator) -> Prompt:
    """A question of ``template`` about world ``kb_seed``, answered by following its hops."""
    kind, hops = TEMPLATES[template]
    kb: World = world(kb_seed)
    subjects = sorted(kb.born if kind == "person" else kb.founder)
    x = subjects[rng.integers(len(subjects))]
    entity, searches = x, []
    for relation, word in hops:
        searches.append(f"{entity} {word}")
        entity = getattr(kb, relation)[entity]
    meta = {"kb": kb_seed, "hops": len(hops), "level": len(hops), "searches": searches}
    return Prompt(uid=0, text=template.format(x=x), answer=entity, meta=meta)


def kb_questions(cfg: TaskConfig, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, eval): one question per world, templates drawn uniformly (so 3 in 7 need two
    searches)."""
    rng = np.random.default_rng(seed)
    names = list(TEMPLATES)
    prompts = []
    for index in range(cfg.train_size + cfg.eval_size):
        prompt = kb_question(seed * SEEDS_PER_RUN + index, names[rng.integers(len(names))], rng)
        prompt.uid = index
        prompts.append(prompt)
    return prompts[cfg.eval_size :], prompts[: cfg.eval_size]
