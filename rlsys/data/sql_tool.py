"""The ``sql`` tool: read-only SQLite queries over a task database, safe against any model
text.

Each database lives in memory in the worker that uses it, built from its seed
(``rlsys/data/sql_world.py``) and then locked down, so nothing the model writes can change it,
reach a file, or run without bound:

* ``PRAGMA query_only`` and an authorizer that allows only SELECT, reading columns, calling
  functions (a few dangerous ones excepted) and recursive CTEs: writes, schema changes,
  PRAGMA, ATTACH/DETACH and transactions are denied before they run;
* SQLite limits: no attached databases at all, values, LIKE patterns and query text bounded
  in length (a string past 1000 bytes is an error, not a gigabyte allocation); the functions
  that could spend unbounded time inside one step (``printf``/``format``) or make blobs
  (``zeroblob``, ``randomblob``) are denied;
* a progress handler aborts a query after ``task.env.sql.time_limit_ms`` (a recursive CTE
  that never ends is cut);
* at most ``max_rows`` rows are fetched and the text is cut to ``max_chars``.

Errors of any kind come back as an ``error: ...`` result; ``run`` never raises.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass

from rlsys.config.env import SQLToolConfig
from rlsys.data.sql_world import company, write_company

_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
_ALLOWED.add(getattr(sqlite3, "SQLITE_RECURSIVE", 33))  # WITH RECURSIVE (3.8.3+)
# Functions that could load code or spend time or memory inside one VM step, where the
# progress handler cannot stop them (printf('%.*c', 2e9, 'x') loops for seconds).
_DENIED_FUNCTIONS = {
    "load_extension",
    "fts3_tokenizer",
    "randomblob",
    "zeroblob",
    "printf",
    "format",
}
_MAX_VALUE_BYTES = 1_000  # SQLITE_LIMIT_LENGTH: the longest string or blob a query may make
_MAX_LIKE_PATTERN = 100  # SQLITE_LIMIT_LIKE_PATTERN_LENGTH
_PROGRESS_EVERY = 1_000  # VM instructions between time-limit checks
NO_ROWS = "no rows"


@dataclass(frozen=True)
class ToolReply:
    """A tool's answer: the result text and whether it is an error."""

    text: str
    error: bool = False


def format_value(value) -> str:
    """One cell as text: integers plainly, floats without a trailing ``.0``, NULL as NULL."""
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    return str(value)


def format_rows(rows: list[tuple], more: bool = False) -> str:
    """Rows as compact text: cells joined by ", ", rows by "; " (``more``: rows were cut)."""
    if not rows:
        return NO_ROWS
    text = "; ".join(", ".join(format_value(v) for v in row) for row in rows)
    return text + "; ..." if more else text


def _authorize(action: int, arg1, arg2, db_name, trigger) -> int:
    if action not in _ALLOWED:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


class SQLDatabase:
    """A read-only, time- and size-bounded connection to one in-memory database."""

    def __init__(self, conn: sqlite3.Connection, limits: SQLToolConfig) -> None:
        """Lock down ``conn`` (no other handle to it may stay open for writing)."""
        self.limits = limits
        self.deadline = 0.0
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, _MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, limits.max_query_chars)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, _MAX_LIKE_PATTERN)
        conn.set_authorizer(_authorize)
        conn.set_progress_handler(self._over_time, _PROGRESS_EVERY)
        self.conn = conn
        # One statement at a time: the trajectories of a prompt share this database and step
        # on threads of their own, and two threads in one sqlite3 connection deadlock (one
        # holds SQLite's connection mutex and waits for the GIL in the progress handler, the
        # other holds the GIL and waits for the mutex).
        self.lock = threading.Lock()

    @classmethod
    def from_seed(cls, seed: int, limits: SQLToolConfig | None = None) -> SQLDatabase:
        """Database ``seed`` of the sql task, built in memory and locked down."""
        conn = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
        write_company(company(seed), conn)
        return cls(conn, limits or SQLToolConfig())

    def _over_time(self) -> int:
        return int(time.monotonic() > self.deadline)  # nonzero aborts the statement

    def run(self, query: str) -> ToolReply:
        """The query's rows as text (``format_rows``), or an error reply; never raises."""
        if len(query) > self.limits.max_query_chars:
            return ToolReply(f"error: query longer than {self.limits.max_query_chars} chars", True)
        with self.lock:
            self.deadline = time.monotonic() + self.limits.time_limit_ms / 1000
            cursor = None
            try:
                cursor = self.conn.execute(query)
                rows = cursor.fetchmany(self.limits.max_rows + 1)
            except sqlite3.OperationalError as exc:
                message = str(exc)
                if message == "interrupted":
                    message = f"query ran over {self.limits.time_limit_ms} ms"
                return ToolReply(f"error: {message}", True)
            except (sqlite3.Error, ValueError, OverflowError, MemoryError) as exc:
                # DatabaseError, ProgrammingError (two statements), "contains a null character"
                return ToolReply(f"error: {exc}", True)
            finally:
                if cursor is not None:
                    cursor.close()  # ends the statement: nothing keeps running
        more = len(rows) > self.limits.max_rows
        text = format_rows(rows[: self.limits.max_rows], more)
        if len(text) > self.limits.max_chars:
            text = text[: self.limits.max_chars - 3] + "..."
        return ToolReply(text)
