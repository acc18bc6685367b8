"""The ``search`` tool: BM25 search over a task's passages with SQLite FTS5.

Each index lives in memory in the worker that uses it, built from its seed
(``rlsys/data/kb_world.py``): one FTS5 row per passage, ranked by FTS5's ``rank`` (its
``bm25()``, Robertson et al.'s Okapi BM25 with FTS5's constants k1=1.2, b=0.75). The model's
query is never passed as FTS5 syntax: it is read as words (letters and digits), each a
quoted literal term, joined by OR, so quotes, operators or a stray ``NEAR(`` cannot make a
syntax error and a passage matching more of the words ranks higher. The top
``task.env.search.top_k`` passages come back, cut to ``max_chars``; ``run`` never raises.
"""

from __future__ import annotations

import re
import sqlite3
import threading

from rlsys.config.env import SearchToolConfig
from rlsys.data.kb_world import world
from rlsys.data.sql_tool import ToolReply

_WORD = re.compile(r"[A-Za-z0-9]+")
MAX_TERMS = 16  # words of a query used; the rest are ignored
NO_MATCH = "no match"


def fts_query(text: str) -> str:
    """The FTS5 MATCH expression of a free-text query: its words as literal terms, OR-ed
    ("" when it has none)."""
    return " OR ".join(f'"{w}"' for w in _WORD.findall(text)[:MAX_TERMS])


class SearchIndex:
    """An in-memory FTS5 index of passages."""

    def __init__(self, passages: list[str], limits: SearchToolConfig) -> None:
        self.limits = limits
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        conn.execute("CREATE VIRTUAL TABLE passages USING fts5(body)")
        conn.executemany("INSERT INTO passages(body) VALUES (?)", [(p,) for p in passages])
        conn.execute("PRAGMA query_only = ON")
        self.conn = conn
        self.lock = threading.Lock()  # one query at a time (see SQLDatabase.lock)

    @classmethod
    def from_seed(cls, seed: int, limits: SearchToolConfig | None = None) -> SearchIndex:
        """The index of the search task's world ``seed``."""
        return cls(world(seed).passages(), limits or SearchToolConfig())

    def run(self, query: str) -> ToolReply:
        """The best passages for ``query``, best first, or an error reply; never raises."""
        if len(query) > self.limits.max_query_chars:
            return ToolReply(f"error: query longer than {self.limits.max_query_chars} chars", True)
        match = fts_query(query)
        if not match:
            return ToolReply("error: the query has no words", True)
        try:
            with self.lock:
                rows = self.conn.execute(
                    "SELECT body FROM passages WHERE passages MATCH ? ORDER BY rank LIMIT ?",
                    (match, self.limits.top_k),
                ).fetchall()
        except sqlite3.Error as exc:
            return ToolReply(f"error: {exc}", True)
        text = " ".join(body for (body,) in rows) or NO_MATCH
        if len(text) > self.limits.max_chars:
            text = text[: self.limits.max_chars - 3] + "..."
        return ToolReply(text)
