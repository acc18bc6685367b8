"""Tool-call formats (``task.env.tool_format``): how a model writes a call, how the tools are
declared in its prompt and how a tool's result is sent back.

Environments speak one format, the compact one of rlsys/envs/tools.py: ``step`` gets the
turn's text with ``<call>...</call>`` and answers ``<result>...</result>``. A pretrained chat
model was trained on another. With a chat format the ``EpisodeRunner`` parses the model's turn
with the format, hands the environment the canonical compact call (``canonical_call``) and
sends the environment's result back as a message of the chat template
(rlsys/envs/chat_turns.py), so environments never see the chat format.

- ``compact``: ``<call>NAME ARG</call>`` or ``<call>{json}</call>`` (tools.py), for the
  built-in char-level models; results are plain text inside the model's turn.
- ``hermes`` (Qwen2, Qwen2.5, Hermes-2-Pro): the template declares the tools as JSON function
  signatures inside ``<tools></tools>`` in the system turn (``apply_chat_template(tools=...)``);
  the model writes ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; a result is
  a ``tool`` message, which Qwen's template wraps in ``<tool_response>`` inside a user turn.
- ``smollm2``: what SmolLM2-Instruct was trained with for function calling. Its model card
  (huggingface.co/HuggingFaceTB/SmolLM2-1.7B-Instruct, ``instructions_function_calling.md``,
  commit af70e37) puts the tools in the system prompt as ``<tools>[...]</tools>`` (the list of
  ``get_json_schema`` function specs) and asks for ``<tool_call>[{"name": ..., "arguments":
  {...}}, ...]</tool_call>`` (a JSON list; ``[]`` when no call is needed); its reference
  parser reads the first ``<tool_call>`` block. SmolLM2's own chat template ignores
  ``tools=``, so the format writes that system prompt itself. Results go back as a user turn
  ``<tool_response>\\n...\\n</tool_response>``, as Ollama's SmolLM2 template renders a tool
  message (ollama.com/library/smollm2, template blob dfebd0343bdd).

One call runs per turn. The chat formats run the FIRST ``<tool_call>`` block (and the first
entry of a SmolLM2 list): the turn stops at the first complete call (``stop``), so a later one
is text the engine kept past the stop. The compact parser keeps running the last call, as it
always has. An opened ``<tool_call>`` without its closing tag is a malformed call
(``ToolCallError``), not a final answer.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import ClassVar

from rlsys.envs.tools import CALL_END, CALL_START, ToolCall, ToolCallError, find_call

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_FORMATS = ("auto", "compact", "hermes", "smollm2")  # task.env.tool_format values
_PROBE_TOOL = "rlsys_probe_tool"  # a name no real template prints unless it renders tools


class ToolFormat(ABC):
    """A tool-call format: its stop strings, its parser, and (chat formats) how a conversation
    with tools and tool results is rendered."""

    name: ClassVar[str]
    stop: ClassVar[tuple[str, ...]]  # stop strings that end a turn at a complete call
    chat: ClassVar[bool]  # results are messages of the chat template (not inline text)

    @abstractmethod
    def parse(self, text: str) -> ToolCall | None:
        """The call a model turn makes; None if it makes none (the turn is a final answer).
        Raises ToolCallError for a call that is there but malformed."""

    def render(self, tokenizer, messages: list[dict], tools: list[dict], generation: bool) -> str:
        """The conversation as text, with ``tools`` declared (chat formats only)."""
        raise NotImplementedError(f"the {self.name} tool format does not use a chat template")

    def result_message(self, content: str) -> dict:
        """The chat message that carries a tool's result (chat formats only)."""
        raise NotImplementedError(f"the {self.name} tool format does not use a chat template")

    def call_text(self, call: ToolCall, tools: list[dict]) -> str:
        """``call`` as a model writes it in this format (a demonstration's calls, written by
        an environment in the compact format; chat formats only)."""
        raise NotImplementedError(f"the {self.name} tool format does not use a chat template")


class CompactFormat(ToolFormat):
    """``<call>NAME ARG</call>`` (tools.py): environments parse it themselves and their
    ``<result>`` text is tokenised into the model's turn; nothing is declared in the prompt."""

    name, stop, chat = "compact", (CALL_END,), False

    def parse(self, text: str) -> ToolCall | None:
        return find_call(text)


class HermesFormat(ToolFormat):
    """``<tool_call>\\n{json}\\n</tool_call>`` with ``tool`` result messages. ``native``: the
    template renders ``tools=`` and the tool role itself (Qwen2.5); otherwise the format
    declares the tools in the system turn and sends results as ``<tool_response>`` user turns,
    the way Qwen's template renders them."""

    name, stop, chat = "hermes", (TOOL_CALL_END,), True

    def __init__(self, native: bool = True) -> None:
        self.native = native

    def parse(self, text: str) -> ToolCall | None:
        body = _first_block(text)
        return None if body is None else _call_object(_load_json(body))

    def render(self, tokenizer, messages, tools, generation):
        if self.native:
            return tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=generation, tokenize=False
            )
        return _apply(tokenizer, _with_system(messages, self._declaration(tools)), generation)

    def result_message(self, content: str) -> dict:
        if self.native:
            return {"role": "tool", "content": content}
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}

    def call_text(self, call: ToolCall, tools: list[dict]) -> str:
        return f"{TOOL_CALL_START}\n{json.dumps(_call_json(call, tools))}\n{TOOL_CALL_END}"

    @staticmethod
    def _declaration(tools: list[dict]) -> str | None:
        if not tools:
            return None
        specs = "\n".join(json.dumps(t) for t in tools)
        return (
            "# Tools\n\nYou may call functions to answer the user. Their signatures are inside "
            f"<tools></tools> XML tags:\n<tools>\n{specs}\n</tools>\n\nTo call one, write a "
            "JSON object with its name and arguments inside <tool_call></tool_call> tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
            "</tool_call>"
        )


class SmolLM2Format(ToolFormat):
    """``<tool_call>[{json}, ...]</tool_call>`` after SmolLM2's function-calling system prompt
    (see the module docstring for the source); a single object is read as a one-call list."""

    name, stop, chat = "smollm2", (TOOL_CALL_END,), True

    def parse(self, text: str) -> ToolCall | None:
        body = _first_block(text)
        if body is None:
            return None
        data = _load_json(body)
        if isinstance(data, list):
            if not data:
                return None  # "[]": the model says no call is needed
            data = data[0]
        return _call_object(data)

    def render(self, tokenizer, messages, tools, generation):
        return _apply(tokenizer, _with_system(messages, self._declaration(tools)), generation)

    def result_message(self, content: str) -> dict:
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}

    def call_text(self, call: ToolCall, tools: list[dict]) -> str:
        return f"{TOOL_CALL_START}[{json.dumps(_call_json(call, tools))}]{TOOL_CALL_END}"

    @staticmethod
    def _declaration(tools: list[dict]) -> str | None:
        if not tools:
            return None
        # the model card's system prompt: the model was fine-tuned on this wording
        return (
            "You are an expert in composing functions. You are given a question and a set of "
            "possible functions.\nBased on the question, you will need to make one or more "
            "function/tool calls to achieve the purpose.\nIf none of the functions can be "
            "used, point it out and refuse to answer.\nIf the given question lacks the "
            "parameters required by the function, also point it out.\n\nYou have access to "
            f"the following tools:\n<tools>{json.dumps(tools)}</tools>\n\nThe output MUST "
            "strictly adhere to the following format, and NO other text MUST be included.\n"
            "The example format is as follows. Please make sure the parameter type is "
            "correct. If no function call is needed, please make the tool calls an empty "
            "list '[]'.\n<tool_call>[\n"
            '{"name": "func_name1", "arguments": {"argument1": "value1", "argument2": '
            '"value2"}},\n... (more tool calls as required)\n]</tool_call>'
        )


def template_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template prints the ``tools`` it is given."""
    messages = [{"role": "user", "content": "hi"}]
    probe = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe"}}
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=[probe], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
        return False
    return _PROBE_TOOL in text


def make_tool_format(name: str, tokenizer, chat_template: bool) -> ToolFormat:
    """The format ``task.env.tool_format=name`` picks. ``auto``: compact without a chat
    template; with one, hermes if the template renders ``tools``, else smollm2."""
    if name == "compact" or (name == "auto" and not chat_template):
        return CompactFormat()
    native = template_renders_tools(tokenizer)
    if name == "hermes" or (name == "auto" and native):
        return HermesFormat(native)
    if name in ("smollm2", "auto"):
        return SmolLM2Format()
    raise ValueError(f"task.env.tool_format={name!r}: use one of {list(TOOL_FORMATS)}")


def single_string_parameter(tools: list[dict], name: str) -> str | None:
    """The parameter of tool ``name`` when it takes exactly one, a string; else None."""
    for tool in tools:
        spec = tool.get("function", tool)
        if spec.get("name") != name:
            continue
        properties = (spec.get("parameters") or {}).get("properties") or {}
        if len(properties) == 1:
            [(param, schema)] = properties.items()
            if isinstance(schema, dict) and schema.get("type") == "string":
                return param
    return None


def canonical_call(call: ToolCall, tools: list[dict]) -> str:
    """The compact JSON call an environment reads back (``find_call``) as ``call``.

    A tool declared with a single string parameter gets that string, not the object: the
    calculator's ``calc(expression: string)`` called with ``{"expression": "37*48"}`` receives
    ``"37*48"``, as a compact ``<call>calc 37*48</call>`` would pass it. ``<`` and ``>`` are
    JSON-escaped so no argument text can close the ``<call>`` block or open another."""
    arguments = call.arguments
    param = single_string_parameter(tools, call.name)
    value = arguments.get(param) if isinstance(arguments, dict) and len(arguments) == 1 else None
    if param is not None and isinstance(value, str):
        arguments = value
    body = json.dumps({"name": call.name, "arguments": arguments})
    body = body.replace("<", "\\u003c").replace(">", "\\u003e")
    return f"{CALL_START}{body}{CALL_END}"


def _call_json(call: ToolCall, tools: list[dict]) -> dict:
    """``call`` as a chat format's JSON object: a compact string argument goes to the tool's
    single string parameter (the inverse of ``canonical_call``)."""
    arguments = call.arguments
    if isinstance(arguments, str):
        param = single_string_parameter(tools, call.name)
        if param is None and not arguments.strip():
            return {"name": call.name, "arguments": {}}  # <call>name</call>: no arguments
        if param is None:
            raise ValueError(
                f"a demonstration calls {call.name}({arguments!r}) with a string, but the "
                f"environment's tools declare no {call.name!r} with one string parameter; "
                "declare it in the factory's tools or demonstrate the call with a JSON object"
            )
        arguments = {param: arguments}
    return {"name": call.name, "arguments": arguments}


def _first_block(text: str) -> str | None:
    """The body of the first ``<tool_call>...</tool_call>``; None without an opening tag."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return None
    start += len(TOOL_CALL_START)
    end = text.find(TOOL_CALL_END, start)
    if end < 0:
        raise ToolCallError(f"{TOOL_CALL_START} is not closed by {TOOL_CALL_END}")
    return text[start:end]


def _load_json(body: str):
    try:
        return json.loads(body)
    except (json.JSONDecodeError, RecursionError) as exc:  # deep nesting recurses
        raise ToolCallError(f"tool call is not valid JSON: {exc}") from exc


def _call_object(data) -> ToolCall:
    """A ``{"name": str, "arguments": object | str}`` call; ToolCallError for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"]:
        raise ToolCallError('a tool call is a JSON object with a string "name"')
    arguments = data.get("arguments", {})
    if not isinstance(arguments, (dict, str)):
        raise ToolCallError('"arguments" must be a JSON object')
    return ToolCall(data["name"], arguments)


def _with_system(messages: list[dict], declaration: str | None) -> list[dict]:
    """``messages`` with ``declaration`` appended to the system turn (one is added if none)."""
    if declaration is None:
        return messages
    if messages and messages[0]["role"] == "system":
        system = {"role": "system", "content": f"{messages[0]['content']}\n\n{declaration}"}
        return [system, *messages[1:]]
    return [{"role": "system", "content": declaration}, *messages]


def _apply(tokenizer, messages: list[dict], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)
