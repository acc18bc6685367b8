"""One trajectory's conversation as the endpoint sees it: the OpenAI messages an agent sends,
rendered to token ids with the policy's chat template and tool format, and every generation
call recorded exactly (prompt ids, generated ids, behaviour logprobs, policy versions).

Token in, token out: an assistant message the endpoint itself returned is rendered back as
the exact text the model generated, special tokens included but for trailing ones such as
EOS, whose place the template's own turn end takes (the message is found by its tool-call
ids or its content, as the agent read it: without special tokens), and a prompt
whose text extends an earlier call's prompt + generation reuses that call's ids, so the
generated tokens reappear unchanged at the same positions (what ``stitch`` trains on).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable

from rlsys.envs.tool_formats import TOOL_CALL_END, TOOL_CALL_START, ToolFormat
from rlsys.run.json_http import RequestError
from rlsys.types import Completion


@dataclasses.dataclass(frozen=True)
class CallSpec:
    """What one chat completion asks the policy for (beyond the prompt ids)."""

    max_tokens: int | None  # the request's bound (None: the run's)
    temperature: float | None  # the request's (the training runner keeps the run's)
    stop: tuple[str, ...]  # the request's stop strings plus the tool format's when tools are sent


@dataclasses.dataclass
class RecordedCall:
    """One generation call of a session, exactly as the engine produced it."""

    prompt_ids: list[int]  # (P,) the rendered conversation the call continued
    token_ids: list[int]  # (R,) generated tokens
    logprobs: list[float]  # (R,) behaviour log pi(token | prefix)
    versions: list[int]  # (R,) policy version of each generated token
    finish_reason: str  # the engine's: stop | length
    prompt_text: str  # the rendering the prompt ids encode
    text: str  # the generated ids decoded with special tokens
    reply: str  # the generated ids decoded without special tokens (what the agent reads)
    turn_len: int  # generated ids before any trailing special tokens (EOS: the template's end)
    turn_text: str  # those ids decoded with special tokens: the assistant turn rendered back


# (session, prompt ids, spec) -> the engine's completion; None: the run is ending
Generate = Callable[["Session", list[int], CallSpec], Completion | None]


class Session:
    """One agent trajectory: its recorded calls, and the ids it issued to map messages back."""

    def __init__(self, sid: str, generate: Generate, tokenizer, fmt: ToolFormat) -> None:
        self.id, self.generate, self.tokenizer, self.fmt = sid, generate, tokenizer, fmt
        self.calls: list[RecordedCall] = []
        self.truncated = False  # a call was refused for the trajectory's bounds
        self.too_long: str | None = None  # why its first prompt was refused, if it was
        self.lock = threading.Lock()
        self._by_tool_call: dict[str, int] = {}  # tool call id -> call index
        self._by_content: dict[str, int] = {}  # returned content -> call index
        specials = getattr(tokenizer, "all_special_ids", None) or []
        self._specials = set(specials)

    @property
    def tool_calls(self) -> int:
        """Tool calls the endpoint returned on this session."""
        return len(self._by_tool_call)

    def record(self, prompt_ids: list[int], prompt_text: str, c: Completion) -> RecordedCall:
        """Record a call's completion; returns the record."""
        turn = list(c.token_ids)
        while turn and turn[-1] in self._specials:  # the template writes its own turn end
            turn.pop()
        decode = self.tokenizer.decode
        call = RecordedCall(
            list(prompt_ids),
            list(c.token_ids),
            list(c.logprobs),
            list(c.versions()),
            c.finish_reason,
            prompt_text,
            decode(c.token_ids, skip_special_tokens=False),
            decode(c.token_ids, skip_special_tokens=True),
            len(turn),
            decode(turn, skip_special_tokens=False),
        )
        self.calls.append(call)
        return call

    def issued(self, index: int, content: str | None, tool_call_ids: list[str]) -> None:
        """Remember what call ``index`` returned, to render it back as its exact text."""
        for tid in tool_call_ids:
            self._by_tool_call[tid] = index
        if content:
            self._by_content[content] = index

    def chat_messages(self, messages: list[dict]) -> list[dict]:
        """The OpenAI messages as the chat template's: the endpoint's own replies as their
        generated text, tool results as the format's result messages."""
        out = []
        for i, m in enumerate(messages):
            role = m["role"]
            if role == "assistant":
                out.append({"role": "assistant", "content": self._assistant_text(m, i)})
            elif role == "tool":
                out.append(self.fmt.result_message(_text(m.get("content"), i)))
            elif role in ("system", "developer"):
                out.append({"role": "system", "content": _text(m.get("content"), i)})
            elif role == "user":
                out.append({"role": "user", "content": _text(m.get("content"), i)})
            else:
                raise RequestError(
                    400,
                    f"messages[{i}].role={role!r}: use system, developer, user, assistant or tool",
                    f"messages[{i}].role",
                )
        return out

    def _assistant_text(self, m: dict, i: int) -> str:
        calls = m.get("tool_calls") or []
        for tc in calls:
            index = self._by_tool_call.get(tc.get("id", "")) if isinstance(tc, dict) else None
            if index is not None:
                return self.calls[index].turn_text
        content = _text(m.get("content"), i) if m.get("content") is not None else ""
        if not calls and content in self._by_content:
            return self.calls[self._by_content[content]].turn_text
        for j, tc in enumerate(calls):  # a call the agent wrote itself: the hermes block
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise RequestError(
                    400,
                    f"messages[{i}].tool_calls[{j}] needs function.name",
                    f"messages[{i}].tool_calls",
                )
            try:
                arguments = json.loads(fn.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = fn.get("arguments")
            block = json.dumps({"name": fn["name"], "arguments": arguments})
            content += f"{TOOL_CALL_START}\n{block}\n{TOOL_CALL_END}"
        return content

    def prompt_ids(self, text: str) -> list[int]:
        """The ids of the rendered prompt ``text``: an earlier call's prompt and generated ids
        when the text extends them (newest first), then the rest encoded on its own."""
        for call in reversed(self.calls):
            heads = [(call.prompt_text + call.text, call.token_ids)]
            if call.turn_len < len(call.token_ids):
                heads.append((call.prompt_text + call.turn_text, call.token_ids[: call.turn_len]))
            for head, ids in heads:
                if text.startswith(head):
                    rest = self.tokenizer.encode(text[len(head) :], add_special_tokens=False)
                    return call.prompt_ids + ids + rest
        return self.tokenizer.encode(text, add_special_tokens=False)


def _text(content, i: int) -> str:
    """A message's content as text: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise RequestError(
        400,
        f"messages[{i}].content must be a string or a list of text parts (only text is served)",
        f"messages[{i}].content",
    )
