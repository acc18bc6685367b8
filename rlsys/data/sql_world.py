"""The synthetic company database behind the ``sql`` task: two small tables whose rows are
drawn from a seed, so every prompt can carry its own database (``meta["db"]``) and no answer
can be memorised, only looked up.

Schema (short names, for small models)::

    emp(name TEXT PRIMARY KEY, dept TEXT, pay INTEGER)   -- pay in thousands, unique per db
    proj(name TEXT PRIMARY KEY, lead TEXT)               -- lead: an emp.name
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import numpy as np

DEPTS = ["Ops", "Sales", "Legal", "Tech"]
PEOPLE = [
    "Ann", "Bob", "Cy", "Dee", "Eli", "Fay", "Gus", "Ivy", "Jo", "Kai", "Lea", "Max",
    "Ned", "Oda", "Pam", "Quin", "Rex", "Sue", "Tom", "Uma", "Val", "Wes", "Xia", "Zed",
]  # fmt: skip
PROJECTS = [
    "Apex", "Bolt", "Core", "Dune", "Echo", "Flux", "Gale", "Hive", "Iris", "Jade",
    "Kite", "Lynx", "Mesa", "Nova", "Onyx", "Pike",
]  # fmt: skip
EMPLOYEES = 9  # rows of emp per database
PROJECT_ROWS = 5  # rows of proj per database
SCHEMA = (
    "CREATE TABLE emp(name TEXT PRIMARY KEY, dept TEXT, pay INTEGER);"
    "CREATE TABLE proj(name TEXT PRIMARY KEY, lead TEXT);"
)


@dataclass(frozen=True)
class Company:
    """One database's rows."""

    emp: tuple[tuple[str, str, int], ...]  # (name, dept, pay)
    proj: tuple[tuple[str, str], ...]  # (name, lead)


def company(seed: int) -> Company:
    """The rows of database ``seed`` (deterministic in it)."""
    rng = np.random.default_rng(seed)
    names = rng.choice(PEOPLE, EMPLOYEES, replace=False).tolist()
    pays = rng.choice(np.arange(30, 100), EMPLOYEES, replace=False).tolist()
    depts = [DEPTS[i % len(DEPTS)] for i in range(EMPLOYEES)]  # every dept has staff
    depts = [depts[i] for i in rng.permutation(EMPLOYEES)]
    projects = rng.choice(PROJECTS, PROJECT_ROWS, replace=False).tolist()
    leads = rng.choice(names, PROJECT_ROWS, replace=True).tolist()
    return Company(
        tuple(zip(names, depts, map(int, pays), strict=True)),
        tuple(zip(projects, leads, strict=True)),
    )


def write_company(rows: Company, conn: sqlite3.Connection) -> None:
    """Create the schema in ``conn`` (empty) and insert ``rows``."""
    conn.executescript(SCHEMA)
    conn.executemany("INSERT INTO emp VALUES (?, ?, ?)", rows.emp)
    conn.executemany("INSERT INTO proj VALUES (?, ?)", rows.proj)
    conn.commit()
