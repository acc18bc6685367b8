"""The calculator tool environment: arithmetic word problems the model solves by calling
``calc`` and then stating the number (``task=calculator_tool``).

A good trajectory: ``<call>calc 37*48</call>`` (model) ``<result>1776</result>`` (tool)
``1776`` + EOS (model). A turn without a tool call is the final answer: reward 1 if its last
number is the answer, else 0. A malformed call gets an error result and the model may try
again while turns remain. With a chat tool format (``task.env.tool_format``) the model calls
``calc`` as declared in ``tools``, e.g. ``{"name": "calc", "arguments": {"expression":
"37*48"}}``; the runner passes the one string parameter on as the expression.
"""

from __future__ import annotations

import ast
import operator

from rlsys.config.env import EnvConfig
from rlsys.envs.base import StepResult
from rlsys.envs.registry import ENVS
from rlsys.envs.tools import (
    ToolCallError,
    find_call,
    format_call,
    format_result,
    string_tool,
)
from rlsys.rewards.registry import numbers_in, same_number
from rlsys.types import Prompt

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
MAX_EXPRESSION = 64  # characters
MAX_MAGNITUDE = 10**12  # larger intermediate results are refused


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression (numbers, + - * / // %, parentheses, unary
    minus). Raises ValueError for anything else, for division by zero and for huge values:
    no names, calls or powers, so model text cannot run code or exhaust memory."""
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expression!r}") from exc

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            out = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            out = -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        elif isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            try:
                out = _OPS[type(node.op)](value(node.left), value(node.right))
            except ZeroDivisionError as exc:
                raise ValueError("division by zero") from exc
        else:
            raise ValueError(f"unsupported syntax in {expression!r}")
        if abs(out) > MAX_MAGNITUDE:
            raise ValueError("value too large")
        return out

    result = value(tree.body)
    return int(result) if float(result).is_integer() else round(result, 6)


class CalculatorEpisode:
    """One word problem's trajectory."""

    def __init__(self, answer: str) -> None:
        self.answer = answer

    def step(self, action: str) -> StepResult:
        try:
            call = find_call(action)
        except ToolCallError as exc:
            return StepResult(format_result(f"error: {exc}"), tool_error=True)
        if call is None:  # the final answer
            numbers = numbers_in(action)
            correct = bool(numbers) and same_number(numbers[-1], self.answer)
            return StepResult(reward=float(correct), done=True, correct=correct)
        if call.name != "calc" or not isinstance(call.arguments, str):
            return StepResult(
                format_result("error: the one tool is calc, with an expression string"),
                tool_error=True,
            )
        try:
            result = evaluate(call.arguments)
        except ValueError as exc:
            return StepResult(format_result(f"error: {exc}"), tool_error=True)
        return StepResult(format_result(str(result)), tool_call=True)


@ENVS.register("calculator")
class Calculator:
    """Makes calculator episodes; demonstrates a call on ``meta["expression"]``."""

    stop = ["</call>"]  # a model turn ends when its call is complete
    tools = [  # what a chat tool format declares in the prompt
        string_tool(
            "calc",
            "Evaluate an arithmetic expression (+ - * / // % and parentheses).",
            "expression",
            "e.g. 37*48",
        )
    ]

    def __init__(self, cfg: EnvConfig | None = None) -> None:
        """``cfg`` (``task.env``) has no calculator knobs; taken as every factory takes it."""

    def __call__(self, prompt: Prompt) -> CalculatorEpisode:
        return CalculatorEpisode(prompt.answer)

    def demonstration(self, prompt: Prompt) -> list[tuple[str, bool]]:
        expression = prompt.meta["expression"]
        return [
            (format_call("calc", expression), True),
            (format_result(str(evaluate(expression))), False),
            (prompt.answer, True),
        ]
