"""Example agents for ``task.env.name=openai_agent``: plain loops against the OpenAI client
API, nothing rlsys-specific in them but the ``Prompt`` they are handed.

``task.env.agent=rlsys.agents.examples:calculator_agent``
"""

from __future__ import annotations

import json

from rlsys.envs.calculator import evaluate
from rlsys.rewards.registry import numbers_in, same_number
from rlsys.types import Prompt

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression, e.g. 37*48.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
MAX_ROUNDS = 3  # model replies per problem


def calculator_agent(client, prompt: Prompt) -> float:
    """Ask the question with a ``calc`` tool, run each call locally and send its result back,
    until the model answers in text; 1.0 if the answer's last number is right, else 0.0."""
    messages: list[dict] = [{"role": "user", "content": prompt.text}]
    for _ in range(MAX_ROUNDS):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALC_TOOL])
        message = reply.choices[0].message
        if not message.tool_calls:
            numbers = numbers_in(message.content or "")
            return float(bool(numbers) and same_number(numbers[-1], prompt.answer))
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": _run(call.function)}
            )
    return 0.0


def _run(function) -> str:
    """The result of one ``calc`` call as text (an error message for a bad one)."""
    if function.name != "calc":
        return f"error: unknown tool {function.name!r}"
    try:
        expression = json.loads(function.arguments).get("expression", "")
        return str(evaluate(str(expression)))
    except (ValueError, AttributeError) as exc:
        return f"error: {exc}"
