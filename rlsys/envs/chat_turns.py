"""Translation between a model's tool-call format and the environments' compact API, one
transcript per trajectory (used by ``EpisodeRunner``; formats in rlsys/envs/tool_formats.py).

``CompactTurns`` changes nothing: the environment gets the turn's text and its observation
is tokenised as it is. ``ChatTurns`` parses the turn with a chat format and steps the
environment with the canonical compact call; the environment's ``<result>X</result>`` becomes
the format's result message with content X (another observation, e.g. a game's reply, a user
message) and its tokens are the template's own rendering of it:

    observation = render(messages + [assistant turn, result message], generation prompt)
                  minus (render(messages, generation prompt) + the turn's text)

i.e. the end of the model's turn the template writes (``<|im_end|>\\n``), the result message
and the next assistant header, as text, then tokenised alone. The model's tokens are never
re-tokenised (token in, token out); the renderings must extend each other (the prefix
property), else ``ChatTemplateError`` names the template. A malformed call is answered by the
runner (``<result>error: ...</result>``, ``tool_error``) without stepping the environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

from rlsys.config.errors import ConfigError
from rlsys.envs.base import Environment, StepResult
from rlsys.envs.tool_formats import ToolFormat, canonical_call
from rlsys.envs.tools import (
    CALL_BLOCK,
    CALL_END,
    RESULT_END,
    RESULT_START,
    ToolCallError,
    find_call,
    format_result,
)
from rlsys.types import Prompt

Tokens = tuple[list[int], list[int]]  # token ids and their loss mask (1: the model's)


class ChatTemplateError(ConfigError):
    """The chat template re-renders earlier turns differently once a message is added."""


class Transcript(Protocol):
    """One trajectory's translator: steps its environment with a model turn, then gives the
    observation's token ids."""

    def action(self, text: str) -> str | StepResult:
        """What the environment's ``step`` gets for a model turn's ``text`` (its compact API),
        or the answer itself when the turn needs no environment (a malformed call)."""
        ...

    def step(self, env: Environment, text: str) -> StepResult: ...

    def observation_ids(self, observation: str) -> list[int]: ...


class Turns(Protocol):
    """A tool format as the runner sees it: the turn's stop strings and per-trajectory
    transcripts."""

    stop: list[str]

    def start(self, prompt: Prompt) -> Transcript: ...

    def demonstration(self, prompt: Prompt, parts: list[tuple[str, bool]]) -> Tokens:
        """An environment's demonstration (compact (text, is_model_turn) parts) as the SFT
        warm start's token ids and loss mask in this format."""
        ...


class CompactTranscript:
    """Today's behaviour: text in, text out, the observation tokenised as it is."""

    def __init__(self, tokenizer, max_observation_tokens: int) -> None:
        self.tokenizer, self.max_observation_tokens = tokenizer, max_observation_tokens

    def action(self, text: str) -> str:
        return text

    def step(self, env: Environment, text: str) -> StepResult:
        return env.step(text)

    def observation_ids(self, observation: str) -> list[int]:
        ids = self.tokenizer.encode(observation, add_special_tokens=False)
        return ids[: self.max_observation_tokens]


class CompactTurns:
    """The compact format: the environment's own stop strings, transcripts that translate
    nothing."""

    def __init__(self, factory, tokenizer, max_observation_tokens: int) -> None:
        self.stop = list(getattr(factory, "stop", []))
        self.tokenizer, self.max_observation_tokens = tokenizer, max_observation_tokens

    def start(self, prompt: Prompt) -> CompactTranscript:
        return CompactTranscript(self.tokenizer, self.max_observation_tokens)

    def demonstration(self, prompt: Prompt, parts: list[tuple[str, bool]]) -> Tokens:
        """A demonstration's (text, is_model_turn) parts as token ids and loss mask: model
        parts tokenised as they are, observations as a rollout appends them (cut to
        ``task.env.max_observation_tokens``)."""
        transcript = self.start(prompt)
        ids, mask = [], []
        for text, trained in parts:
            if trained:
                part = self.tokenizer.encode(text, add_special_tokens=False)
            else:
                part = transcript.observation_ids(text)
            ids += part
            mask += [int(trained)] * len(part)
        return ids, mask


class ChatTurns:
    """A chat tool format over a chat template: what the runner needs per trajectory."""

    def __init__(
        self,
        fmt: ToolFormat,
        factory,
        tokenizer,
        messages_of: Callable[[str], list[dict]],
        max_observation_tokens: int,
    ) -> None:
        self.fmt, self.tokenizer, self.messages_of = fmt, tokenizer, messages_of
        self.tools = tool_specs(factory)
        self.max_observation_tokens = max_observation_tokens
        # the format's stop strings, plus the environment's own other than the compact call end
        own = [s for s in getattr(factory, "stop", []) if s != CALL_END]
        self.stop = list(dict.fromkeys([*fmt.stop, *own]))
        self.check_prefix_property()

    def render(self, messages: list[dict], generation: bool) -> str:
        return self.fmt.render(self.tokenizer, messages, self.tools, generation)

    def start(self, prompt: Prompt) -> ChatTranscript:
        return ChatTranscript(self, self.messages_of(prompt.text))

    def demonstration(self, prompt: Prompt, parts: list[tuple[str, bool]]) -> Tokens:
        """A demonstration written in the compact format, as token ids and loss mask in this
        one: each compact call in a model part becomes the format's call (``call_text``),
        each observation the template's tokens between the turns (``observation_ids``, as a
        rollout appends them, masked out)."""
        transcript = self.start(prompt)
        ids, mask = [], []
        for text, trained in parts:
            if trained:
                text = CALL_BLOCK.sub(lambda m: self._call_text(m[0]), text)
                transcript.turn_text += text
                part = self.tokenizer.encode(text, add_special_tokens=False)
            else:
                part = transcript.observation_ids(text)
                transcript.turn_text = ""
            ids += part
            mask += [int(trained)] * len(part)
        return ids, mask

    def _call_text(self, compact: str) -> str:
        """A demonstration's compact call as this format writes it; ConfigError naming the
        keys when the environment's declared tools cannot carry it."""
        try:
            return self.fmt.call_text(find_call(compact), self.tools)
        except ValueError as exc:
            raise ConfigError(
                f"the warm start cannot write this environment's demonstrations in "
                f"task.env.tool_format={self.fmt.name}: {exc}; set warm_start.enabled=false or "
                "task.env.tool_format=compact"
            ) from exc

    def check_prefix_property(self) -> None:
        """Fail now, naming the template, if one tool round trip breaks the prefix property."""
        transcript = ChatTranscript(self, self.messages_of("What is 2 + 3?"))
        transcript.turn_text = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
        transcript.observation_ids(format_result("5"))

    def template_name(self) -> str:
        return getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__


class ChatTranscript:
    """One trajectory's conversation: its messages and their rendering so far."""

    def __init__(self, turns: ChatTurns, messages: list[dict]) -> None:
        self.turns = turns
        self.messages = list(messages)
        self.text = turns.render(self.messages, generation=True)  # == the prompt's text
        self.turn_text = ""

    def action(self, text: str) -> str | StepResult:
        """The canonical compact form of the turn's call (text without a call, the final
        answer, goes as it is); a malformed call is answered here."""
        self.turn_text = text
        try:
            call = self.turns.fmt.parse(text)
        except ToolCallError as exc:
            return StepResult(format_result(f"error: {exc}"), tool_error=True)
        return text if call is None else canonical_call(call, self.turns.tools)

    def step(self, env: Environment, text: str) -> StepResult:
        """Step ``env`` with ``action(text)`` (or answer a malformed call)."""
        action = self.action(text)
        return action if isinstance(action, StepResult) else env.step(action)

    def observation_ids(self, observation: str) -> list[int]:
        """The template's tokens after the last turn: its end, ``observation`` as a message
        and the next assistant header (a delta of two renderings)."""
        turn = {"role": "assistant", "content": self.turn_text}
        messages = [*self.messages, turn, self._message(observation)]
        rendered = self.turns.render(messages, generation=True)
        head = self.text + self.turn_text
        if not rendered.startswith(head):
            at = len(os.path.commonprefix([head, rendered]))
            raise ChatTemplateError(
                f"the chat template of {self.turns.template_name()!r} with "
                f"task.env.tool_format={self.turns.fmt.name} re-renders the conversation "
                f"differently once a tool result is added (first difference at character "
                f"{at}: {head[at : at + 40]!r} became {rendered[at : at + 40]!r}), so the "
                "result's tokens cannot be appended to the model's; use a template whose "
                "renderings extend each other (one that does not rewrite earlier assistant "
                "turns) or task.env.tool_format=compact"
            )
        self.messages, self.text = messages, rendered
        return self.turns.tokenizer.encode(rendered[len(head) :], add_special_tokens=False)

    def _message(self, observation: str) -> dict:
        """A ``<result>`` observation as the format's result message (its content cut to
        ``task.env.max_observation_tokens``); anything else as a user message."""
        tokenizer, bound = self.turns.tokenizer, self.turns.max_observation_tokens
        is_result = observation.startswith(RESULT_START) and observation.endswith(RESULT_END)
        content = observation[len(RESULT_START) : -len(RESULT_END)] if is_result else observation
        ids = tokenizer.encode(content, add_special_tokens=False)
        if len(ids) > bound:
            content = tokenizer.decode(ids[:bound])
        if is_result:
            return self.turns.fmt.result_message(content)
        return {"role": "user", "content": content}


def tool_specs(factory) -> list[dict]:
    """The environment's ``tools``: OpenAI-style function specs (``{"type": "function",
    "function": {"name", "description", "parameters"}}``); [] if it declares none."""
    tools = list(getattr(factory, "tools", []))
    for tool in tools:
        spec = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError(
                f"{type(factory).__name__}.tools holds {tool!r}; each tool is "
                '{"type": "function", "function": {"name": ..., "description": ..., '
                '"parameters": <JSON schema>}}'
            )
    return tools
