"""Config of multi-turn environments (``task.env``): see docs/environments.md."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import positive


@dataclass
class SQLToolConfig:
    """``task.env.sql``: the bounds of the ``sql`` tool (rlsys/envs/sql.py). Every query runs
    read-only; these bound its time and what comes back."""

    time_limit_ms: int = 200  # a query still running after this is aborted (an error result)
    max_rows: int = 8  # rows shown; more are cut and marked "..."
    max_chars: int = 160  # result characters shown; a longer result is cut
    max_query_chars: int = 400  # longer queries are refused unparsed

    def __post_init__(self) -> None:
        for key in ("time_limit_ms", "max_rows", "max_chars", "max_query_chars"):
            positive(f"task.env.sql.{key}", getattr(self, key))


@dataclass
class SearchToolConfig:
    """``task.env.search``: the ``search`` tool over the task's passage index
    (rlsys/envs/search.py)."""

    top_k: int = 1  # passages returned per query, best (BM25) first
    max_chars: int = 160  # result characters shown; a longer result is cut
    max_query_chars: int = 200  # longer queries are refused

    def __post_init__(self) -> None:
        for key in ("top_k", "max_chars", "max_query_chars"):
            positive(f"task.env.search.{key}", getattr(self, key))


@dataclass
class EnvConfig:
    """``task.env``: the environment a rollout talks to between model turns (null name:
    single-turn, the model answers once)."""

    name: str | None = None  # a registered environment: calculator | guess_number | sql | search
    max_turns: int = 4  # model turns per trajectory; then it ends (truncated)
    # Response tokens over all turns, observations included (the model's turn gets what is
    # left, at most task.max_new_tokens); null: task.max_new_tokens x max_turns.
    max_total_tokens: int | None = None
    max_observation_tokens: int = 64  # a longer observation or tool result is cut to this
    sql: SQLToolConfig = field(default_factory=SQLToolConfig)  # the sql environment's tool
    search: SearchToolConfig = field(default_factory=SearchToolConfig)  # the search tool

    def __post_init__(self) -> None:
        positive("task.env.max_turns", self.max_turns)
        positive("task.env.max_observation_tokens", self.max_observation_tokens)
        if self.max_total_tokens is not None:
            positive("task.env.max_total_tokens", self.max_total_tokens)
