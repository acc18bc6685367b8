"""The tool-call format and its parser.

A model calls a tool by writing ``<call>NAME ARGUMENT</call>`` (compact, for small models:
``<call>calc 37*48</call>``) or ``<call>{"name": "calc", "arguments": "37*48"}</call>``
(JSON; ``arguments`` may be a string or an object). The rollout stops the turn at
``</call>`` (``CALL_END`` is a stop string), the environment runs the tool and the result
comes back as ``<result>...</result>``. This is the format environments speak; a chat model's
own format is translated to it by the rollout (rlsys/envs/tool_formats.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

CALL_START, CALL_END = "<call>", "</call>"
RESULT_START, RESULT_END = "<result>", "</result>"
CALL_BLOCK = re.compile(re.escape(CALL_START) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_NAME = re.compile(r"[A-Za-z_][\w.-]*")


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's name and its argument (a string or a JSON object)."""

    name: str
    arguments: str | dict


def string_tool(name: str, description: str, parameter: str, about: str) -> dict:
    """The OpenAI-style function spec of a tool that takes one string, ``parameter`` (what a
    chat tool format declares in the prompt; a compact ``<call>NAME TEXT</call>`` passes the
    same string)."""
    properties = {parameter: {"type": "string", "description": about}}
    schema = {"type": "object", "properties": properties, "required": [parameter]}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": schema},
    }


class ToolCallError(ValueError):
    """A ``<call>`` block that does not parse."""


def find_call(text: str) -> ToolCall | None:
    """The last tool call in a model turn; None if it has no ``<call>...</call>`` block.
    Raises ToolCallError for a block that is there but malformed."""
    blocks = CALL_BLOCK.findall(text)
    if not blocks:
        return None
    body = blocks[-1].strip()
    if body.startswith("{"):
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, RecursionError) as exc:  # deep nesting recurses
            raise ToolCallError(f"tool call is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ToolCallError('a JSON tool call needs a string "name"')
        args = data.get("arguments", "")
        if not isinstance(args, (str, dict)):
            raise ToolCallError('"arguments" must be a string or an object')
        return ToolCall(data["name"], args)
    name, _, args = body.partition(" ")
    if not _NAME.fullmatch(name):
        raise ToolCallError(f"tool call {body[:40]!r} does not start with a tool name")
    return ToolCall(name, args.strip())


def format_call(name: str, arguments: str) -> str:
    """The compact call text the parser reads back as ``ToolCall(name, arguments)``."""
    return f"{CALL_START}{name} {arguments}{CALL_END}"


def format_result(text: str) -> str:
    """A tool's result as the observation the model sees."""
    return f"{RESULT_START}{text}{RESULT_END}"
