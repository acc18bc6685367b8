"""The synthetic knowledge base behind the ``search`` task: made-up people, companies and
cities and one-sentence facts about them, drawn from a seed, so every prompt can carry its own
world (``meta["kb"]``) and no answer can be memorised, only looked up.

Facts (one passage each)::

    <person> was born in <city>.      <company> was founded by <person>.
    <person> works at <company>.      <company> is based in <city>.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
PEOPLE, COMPANIES, CITIES = 4, 3, 3  # entities per world


@dataclass(frozen=True)
class World:
    """One knowledge base: its entities and the facts that join them."""

    born: dict[str, str]  # person -> city
    works: dict[str, str]  # person -> company
    founder: dict[str, str]  # company -> person
    based: dict[str, str]  # company -> city

    def passages(self) -> list[str]:
        """The facts as sentences, one passage each (the search index's documents)."""
        return (
            [f"{p} was born in {c}." for p, c in self.born.items()]
            + [f"{p} works at {c}." for p, c in self.works.items()]
            + [f"{c} was founded by {p}." for c, p in self.founder.items()]
            + [f"{c} is based in {t}." for c, t in self.based.items()]
        )


def _word(rng: np.random.Generator, syllables: int, end: str = "") -> str:
    return ("".join(rng.choice(_SYLLABLES, syllables)) + end).capitalize()


def world(seed: int) -> World:
    """The world of ``seed`` (deterministic in it). Every name is a distinct word, so a name
    is a search term that only its own facts contain."""
    rng = np.random.default_rng(seed)
    words: set[str] = set()

    def fresh(make) -> str:
        while True:
            name = make()
            parts = name.split()
            if not words.intersection(parts):
                words.update(parts)
                return name

    people = [fresh(lambda: f"{_word(rng, 2)} {_word(rng, 2, 'n')}") for _ in range(PEOPLE)]
    companies = [fresh(lambda: _word(rng, 2, "x")) for _ in range(COMPANIES)]
    cities = [fresh(lambda: _word(rng, 3)) for _ in range(CITIES)]

    def pick(options: list[str]) -> str:
        return options[rng.integers(len(options))]

    return World(
        born={p: pick(cities) for p in people},
        works={p: pick(companies) for p in people},
        founder={c: pick(people) for c in companies},
        based={c: pick(cities) for c in companies},
    )
