"""Lookup environments: the model queries one tool (``sql`` or ``search``) as often as it
needs, then states the answer (``task=sql``, ``task=search``).

A turn with a ``<call>TOOL ARGUMENT</call>`` gets the tool's ``<result>...</result>``; a turn
without a call is the final answer, reward 1 if it matches the reference (``sql``: the same
set of values, ``search``: the same normalised text; rlsys/envs/answers.py), else 0. A
malformed call, another tool's name or a tool error is answered with an error result, and
the model may try again while turns remain. Databases and indexes are built in memory from
the prompt's seed (``meta["db"]``, ``meta["kb"]``) and kept per worker, the most recent
``CACHED`` of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from rlsys.config.env import EnvConfig
from rlsys.data.sql_tool import SQLDatabase, ToolReply
from rlsys.envs.answers import exact_match, same_values
from rlsys.envs.base import StepResult
from rlsys.envs.registry import ENVS
from rlsys.envs.search import SearchIndex
from rlsys.envs.tools import (
    CALL_END,
    ToolCallError,
    find_call,
    format_call,
    format_result,
    string_tool,
)
from rlsys.types import Prompt

CACHED = 256  # databases / indexes kept per worker (a step's prompts share them)


class LookupEpisode:
    """One question's trajectory: tool calls, then an answer judged by ``judge``."""

    def __init__(
        self, tool: str, run: Callable[[str], ToolReply], judge: Callable[[str], bool]
    ) -> None:
        self.tool, self.run, self.judge = tool, run, judge

    def step(self, action: str) -> StepResult:
        """Run the turn's call, or judge the turn as the final answer; never raises."""
        try:
            call = find_call(action)
        except ToolCallError as exc:
            return StepResult(format_result(f"error: {exc}"), tool_error=True)
        if call is None:  # the final answer
            correct = self.judge(action)
            return StepResult(reward=float(correct), done=True, correct=correct)
        if call.name != self.tool or not isinstance(call.arguments, str):
            usage = f"error: the tool is {self.tool}, called as <call>{self.tool} TEXT</call>"
            return StepResult(format_result(usage), tool_error=True)
        reply = self.run(call.arguments)
        return StepResult(
            format_result(reply.text), tool_call=not reply.error, tool_error=reply.error
        )


class _Recent(OrderedDict):
    """The ``CACHED`` most recently used tools, by seed."""

    def get_or_make(self, seed: int, make: Callable[[int], object]):
        """The tool of ``seed``, made by ``make(seed)`` when it is not kept."""
        if seed in self:
            self.move_to_end(seed)
        else:
            self[seed] = make(seed)
            if len(self) > CACHED:
                self.popitem(last=False)
        return self[seed]


@ENVS.register("sql")
class SQLEnvironment:
    """``sql``: questions about the prompt's database ``meta["db"]``; demonstrates running
    the reference query ``meta["query"]`` and copying its result."""

    stop = [CALL_END]
    tools = [  # what a chat tool format declares in the prompt
        string_tool(
            "sql",
            "Run one read-only SQLite query on the question's database; returns its rows.",
            "query",
            "e.g. SELECT name FROM people WHERE age > 30",
        )
    ]

    def __init__(self, cfg: EnvConfig | None = None) -> None:
        self.limits = (cfg or EnvConfig()).sql
        self.databases = _Recent()

    def database(self, prompt: Prompt) -> SQLDatabase:
        """The locked-down database of ``prompt`` (``meta["db"]``)."""
        return self.databases.get_or_make(
            int(prompt.meta["db"]), lambda seed: SQLDatabase.from_seed(seed, self.limits)
        )

    def __call__(self, prompt: Prompt) -> LookupEpisode:
        return LookupEpisode(
            "sql", self.database(prompt).run, lambda text: same_values(text, prompt.answer)
        )

    def demonstration(self, prompt: Prompt) -> list[tuple[str, bool]]:
        query = prompt.meta["query"]
        return [
            (format_call("sql", query), True),
            (format_result(self.database(prompt).run(query).text), False),
            (prompt.answer, True),
        ]


@ENVS.register("search")
class SearchEnvironment:
    """``search``: questions about the prompt's knowledge base ``meta["kb"]``; demonstrates
    the searches of ``meta["searches"]`` (one per hop) and the answer."""

    stop = [CALL_END]
    tools = [
        string_tool(
            "search",
            "Full-text search over the question's passages; returns the best matches.",
            "query",
            "words to look for, e.g. Dee city",
        )
    ]

    def __init__(self, cfg: EnvConfig | None = None) -> None:
        self.limits = (cfg or EnvConfig()).search
        self.indexes = _Recent()

    def index(self, prompt: Prompt) -> SearchIndex:
        """The passage index of ``prompt``'s world (``meta["kb"]``)."""
        return self.indexes.get_or_make(
            int(prompt.meta["kb"]), lambda seed: SearchIndex.from_seed(seed, self.limits)
        )

    def __call__(self, prompt: Prompt) -> LookupEpisode:
        return LookupEpisode(
            "search", self.index(prompt).run, lambda text: exact_match(text, prompt.answer)
        )

    def demonstration(self, prompt: Prompt) -> list[tuple[str, bool]]:
        segments: list[tuple[str, bool]] = []
        for words in prompt.meta["searches"]:
            segments.append((format_call("search", words), True))
            segments.append((format_result(self.index(prompt).run(words).text), False))
        return [*segments, (prompt.answer, True)]
