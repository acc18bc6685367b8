"""Config of multi-turn environments (``task.env``): see docs/environments.md."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.checks import one_of, positive


@dataclass
class EnvConfig:
    """``task.env``: the environment a rollout talks to between model turns (null name:
    single-turn, the model answers once)."""

    name: str | None = None  # a registered environment: calculator | guess_number
    max_turns: int = 4  # model turns per trajectory; then it ends (truncated)
    # Response tokens over all turns, observations included (the model's turn gets what is
    # left, at most task.max_new_tokens); null: task.max_new_tokens x max_turns.
    max_total_tokens: int | None = None
    max_observation_tokens: int = 64  # a longer observation or tool result is cut to this
    # How the model calls tools (docs/environments.md): compact (`<call>NAME ARG</call>`,
    # results inline; the built-in models) | hermes (`<tool_call>{json}</tool_call>`, tools and
    # results as the chat template renders them; Qwen2/2.5) | smollm2 (SmolLM2-Instruct's
    # function-calling prompt, `<tool_call>[...]</tool_call>`) | auto: compact without
    # task.chat_template, else hermes if the template renders tools, else smollm2
    tool_format: str = "auto"

    def __post_init__(self) -> None:
        one_of("task.env.tool_format", self.tool_format, ("auto", "compact", "hermes", "smollm2"))
        positive("task.env.max_turns", self.max_turns)
        positive("task.env.max_observation_tokens", self.max_observation_tokens)
        if self.max_total_tokens is not None:
            positive("task.env.max_total_tokens", self.max_total_tokens)
