"""Config of multi-turn environments (``task.env``): see docs/environments.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.errors import ConfigError

SCHEDULING = ("async", "lockstep")
AGENT_ENV = "openai_agent"  # task.env.name of a user agent written against the OpenAI client


@dataclass
class SQLToolConfig:
    """``task.env.sql``: the bounds of the ``sql`` tool (rlsys/data/sql_tool.py). Every query runs
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

    # a registered environment: calculator | guess_number | sql | search | latency |
    # openai_agent (a user agent loop written against the OpenAI client, task.env.agent;
    # docs/environments.md)
    name: str | None = None
    max_turns: int = 4  # model turns per trajectory; then it ends (truncated)
    # Response tokens over all turns, observations included (the model's turn gets what is
    # left, at most task.max_new_tokens); null: task.max_new_tokens x max_turns.
    max_total_tokens: int | None = None
    max_observation_tokens: int = 64  # a longer observation or tool result is cut to this
    # async: each trajectory's next turn goes out as soon as its tool returns (batched per
    # generation call); lockstep: one call for every live trajectory's next turn, after all
    # of their tools returned
    scheduling: str = "async"
    # environment steps (tool calls) running at once, over all trajectories of this driver
    # (1 with lockstep: one after the other, as before asynchronous turns)
    max_concurrent_steps: int = 16
    # a step still running after this long answers the model with a tool error and ends its
    # trajectory (its thread is abandoned); null: no limit
    step_timeout_s: float | None = 60.0
    # async: once a tool has returned and no generation call is in flight, how long its
    # trajectory waits at most for the tools still running, so their next turns share one
    # call (0: at once); null: as long as the request's last generation call took (sending
    # without them would cost another call about as long), at least 10 ms
    batch_wait_s: float | None = None
    # How the model calls tools (docs/environments.md): compact (`<call>NAME ARG</call>`,
    # results inline; the built-in models) | hermes (`<tool_call>{json}</tool_call>`, tools and
    # results as the chat template renders them; Qwen2/2.5) | smollm2 (SmolLM2-Instruct's
    # function-calling prompt, `<tool_call>[...]</tool_call>`) | auto: compact without
    # task.chat_template, else hermes if the template renders tools, else smollm2
    tool_format: str = "auto"
    # openai_agent: the agent, "package.module:function", called as function(client, prompt)
    # -> reward (float) once per trajectory with an openai.OpenAI client on its own session
    agent: str | None = None
    # openai_agent: an agent still running after this long scores 0 (its thread is abandoned)
    agent_timeout_s: float = 300.0

    # The environment's own settings by name, for an environment that registered a settings
    # class (rlsys/envs/registry.py; docs/extending.md), e.g. {latency_s: 0.05} for latency;
    # an environment added in a plugin takes all of its settings here.
    args: dict[str, Any] = field(default_factory=dict)

    sql: SQLToolConfig = field(default_factory=SQLToolConfig)  # the sql environment's tool
    search: SearchToolConfig = field(default_factory=SearchToolConfig)  # the search tool

    def total_tokens(self, turn_tokens: int) -> int:
        """A trajectory's response-token bound when one model turn (or agent call) may take
        ``turn_tokens``: ``max_total_tokens``, else ``turn_tokens x max_turns``."""
        return self.max_total_tokens or turn_tokens * self.max_turns

    def __post_init__(self) -> None:
        one_of("task.env.tool_format", self.tool_format, ("auto", "compact", "hermes", "smollm2"))
        positive("task.env.max_turns", self.max_turns)
        positive("task.env.max_observation_tokens", self.max_observation_tokens)
        if self.max_total_tokens is not None:
            positive("task.env.max_total_tokens", self.max_total_tokens)
        one_of("task.env.scheduling", self.scheduling, SCHEDULING)
        positive("task.env.max_concurrent_steps", self.max_concurrent_steps)
        if self.step_timeout_s is not None:
            positive("task.env.step_timeout_s", self.step_timeout_s)
        if self.batch_wait_s is not None:
            non_negative("task.env.batch_wait_s", self.batch_wait_s)
        positive("task.env.agent_timeout_s", self.agent_timeout_s)
        if self.args and self.name is None:
            raise ConfigError(
                f"task.env.args={dict(self.args)} is read by the environment task.env.name "
                "names, and task.env.name is null; name the environment or drop task.env.args"
            )
        self._check_agent()

    def _check_agent(self) -> None:
        if self.name == AGENT_ENV:
            module, _, function = (self.agent or "").partition(":")
            if not module or not function:
                raise ConfigError(
                    f"task.env.name=openai_agent needs task.env.agent=package.module:function "
                    f"(got {self.agent!r}), e.g. task.env.agent=rlsys.agents.examples:calculator_agent"
                )
            if self.tool_format == "compact":
                raise ConfigError(
                    "task.env.name=openai_agent renders the agent's messages with the chat "
                    "template; set task.env.tool_format=auto, hermes or smollm2"
                )
        elif self.agent is not None:
            raise ConfigError(
                f"task.env.agent={self.agent!r} is only read with task.env.name=openai_agent "
                f"(task.env.name={self.name!r}); set task.env.name=openai_agent or drop task.env.agent"
            )
