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

# Made-up names, a fixed pool of each kind: a world draws its entities from them and joins
# them at random, so a fact cannot be memorised, but the names are strings a small model sees
# often (copying them is easier than copying strings it has never seen). No word is shared.
PEOPLE = [
    "Zorvan Pell", "Mira Tolk", "Ossen Vey", "Kaila Dunn", "Tobin Rask", "Edda Morn",
    "Lusa Fenn", "Arvo Kest", "Nila Brak", "Pim Orrel", "Sefa Lund", "Ruel Hask",
    "Vanya Cole", "Doro Penk", "Ilse Varn", "Gunn Tabor",
]  # fmt: skip
COMPANIES = [
    "Quillex", "Brontis", "Velcor", "Numina", "Ostrava", "Pellium", "Zentro", "Korvid",
    "Lumeta", "Draxon", "Sabrel", "Fintor",
]  # fmt: skip
CITIES = [
    "Tarsim", "Belmora", "Quenth", "Ardis", "Voltra", "Mirren", "Olbec", "Sunhal",
    "Kestra", "Dorvik", "Ennis", "Palgar",
]  # fmt: skip
PEOPLE_PER_WORLD, COMPANIES_PER_WORLD, CITIES_PER_WORLD = 4, 3, 3


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


def world(seed: int) -> World:
    """The world of ``seed`` (deterministic in it): entities drawn from the pools, every
    relation drawn at random."""
    rng = np.random.default_rng(seed)
    people = rng.choice(PEOPLE, PEOPLE_PER_WORLD, replace=False).tolist()
    companies = rng.choice(COMPANIES, COMPANIES_PER_WORLD, replace=False).tolist()
    cities = rng.choice(CITIES, CITIES_PER_WORLD, replace=False).tolist()

    def pick(options: list[str]) -> str:
        return options[rng.integers(len(options))]

    return World(
        born={p: pick(cities) for p in people},
        works={p: pick(companies) for p in people},
        founder={c: pick(people) for c in companies},
        based={c: pick(cities) for c in companies},
    )
