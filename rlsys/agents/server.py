"""An OpenAI-compatible chat endpoint over the rollout pool, one session per trajectory.

``POST <base>/chat/completions`` (non-streaming, n=1: ``model``, ``messages``, ``tools``,
``temperature``, ``max_tokens`` / ``max_completion_tokens``, ``stop``) and ``GET
<base>/models``, where ``<base>`` is a session's URL, ``http://127.0.0.1:PORT/sessions/<id>/v1``:
an unmodified ``openai.OpenAI(base_url=<base>, api_key=...)`` talks to one trajectory. The
messages are rendered with the policy's chat template and tool format (rlsys/agents/session.py),
generated through the session's ``generate`` (the rollout loop's gated, seeded call) and
recorded; a tool call in the reply comes back as ``tool_calls`` (``finish_reason:
"tool_calls"``). Bad bodies, unknown sessions and paths get OpenAI-style JSON errors (400/404);
a failure inside a request answers 500 and the server goes on.

It is served by ``rlsys.run.json_http`` (the standard library's threaded server; FastAPI and
uvicorn only come with vLLM). It binds 127.0.0.1: sessions are not authenticated.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid

from rlsys.agents.session import CallSpec, Generate, Session
from rlsys.envs.tool_formats import TOOL_CALL_START, ToolFormat
from rlsys.envs.tools import ToolCallError
from rlsys.run.json_http import JsonServer, RequestError, read_json

MODEL_NAME = "rlsys-policy"  # what GET /models lists; any ``model`` a request names is served


class AgentServer:
    """The endpoint and its sessions (``open`` one per trajectory, ``close`` it for its calls)."""

    def __init__(self, tokenizer, fmt: ToolFormat, host: str = "127.0.0.1", port: int = 0) -> None:
        self.tokenizer, self.fmt = tokenizer, fmt
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count()
        self.http = JsonServer(self._route, "agent endpoint", host, port)

    @property
    def url(self) -> str:
        return self.http.url

    def open(self, generate: Generate) -> Session:
        """A new session whose calls go to ``generate``."""
        sid = f"s{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        session = Session(sid, generate, self.tokenizer, self.fmt)
        with self.lock:
            self.sessions[sid] = session
        return session

    def base_url(self, session: Session) -> str:
        return f"{self.url}/sessions/{session.id}/v1"

    def close(self, session: Session) -> None:
        """Forget ``session``: later requests to it get 404."""
        with self.lock:
            self.sessions.pop(session.id, None)

    def shutdown(self) -> None:
        self.http.shutdown()

    def _route(self, method: str, path: str, body: bytes) -> dict:
        parts = path.split("?")[0].strip("/").split("/")
        if parts == ["v1", "models"] and method == "GET":
            return _models()
        if len(parts) < 3 or parts[0] != "sessions" or parts[2] != "v1":
            raise RequestError(
                404,
                f"no route {method} /{'/'.join(parts)}; use a session's "
                "base URL, /sessions/<id>/v1",
            )
        with self.lock:
            session = self.sessions.get(parts[1])
        if session is None:
            raise RequestError(404, f"session {parts[1]!r} is unknown or closed", "session")
        rest = parts[3:]
        if rest == ["models"] and method == "GET":
            return _models()
        if rest == ["chat", "completions"] and method == "POST":
            return self.chat(session, read_json(body))
        raise RequestError(404, f"no route {method} /{'/'.join(rest)} under a session")

    def chat(self, session: Session, request: dict) -> dict:
        """One chat completion on ``session``: render, generate, record, answer."""
        messages, tools, spec = _parse(request, self.fmt)
        with session.lock:  # one call at a time per trajectory: its calls are in order
            text = self.fmt.render(self.tokenizer, session.chat_messages(messages), tools, True)
            ids = session.prompt_ids(text)
            completion = session.generate(session, ids, spec)
            if completion is None:
                raise RequestError(503, "the run is ending; no more generations", code="ending")
            if not completion.token_ids:  # refused for the trajectory's bounds: not recorded
                index = len(session.calls)
                message, finish = {"role": "assistant", "content": ""}, "length"
            else:
                call = session.record(ids, text, completion)
                index = len(session.calls) - 1
                message, finish = self._message(call.reply, tools, completion.finish_reason, index)
            tool_ids = [tc["id"] for tc in message.get("tool_calls", [])]
            session.issued(index, message["content"], tool_ids)
        generated = len(completion.token_ids)
        return {
            "id": f"chatcmpl-{session.id}-{index}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model") or MODEL_NAME,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": len(ids),
                "completion_tokens": generated,
                "total_tokens": len(ids) + generated,
            },
        }

    def _message(self, reply: str, tools: list[dict], finish: str, index: int):
        """The assistant message and OpenAI finish reason of a generated ``reply``."""
        finish = "length" if finish == "length" else "stop"
        if tools:
            try:
                call = self.fmt.parse(reply)
            except ToolCallError:
                call = None  # a malformed call is text; the agent reads it as such
            if call is not None:
                arguments = call.arguments
                if not isinstance(arguments, str):
                    arguments = json.dumps(arguments)
                content = reply[: reply.find(TOOL_CALL_START)].strip() or None
                tool_call = {
                    "id": f"call_{uuid.uuid4().hex[:12]}_{index}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }
                message = {"role": "assistant", "content": content, "tool_calls": [tool_call]}
                return message, "tool_calls"
        return {"role": "assistant", "content": reply}, finish


def _models() -> dict:
    return {
        "object": "list",
        "data": [{"id": MODEL_NAME, "object": "model", "created": 0, "owned_by": "rlsys"}],
    }


def _parse(request: dict, fmt: ToolFormat) -> tuple[list[dict], list[dict], CallSpec]:
    """The messages, tools and call spec of a chat completion request (400 on bad fields)."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError(400, f"messages[{i}] must be an object with a role", "messages")
    if request.get("stream"):
        raise RequestError(400, "stream=true is not served; drop it", "stream")
    if request.get("n", 1) != 1:
        raise RequestError(400, "only n=1 is served (one trajectory per session)", "n")
    tools = request.get("tools") or []
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise RequestError(
            400,
            'tools must be a list of {"type": "function", "function": '
            '{"name": ..., "parameters": ...}}',
            "tools",
        )
    max_tokens = request.get("max_completion_tokens", request.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(400, "max_tokens must be a positive integer", "max_tokens")
    temperature = request.get("temperature")
    if temperature is not None and (
        not isinstance(temperature, int | float) or not 0 <= temperature <= 2
    ):
        raise RequestError(400, "temperature must be a number in [0, 2]", "temperature")
    stop = request.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RequestError(400, "stop must be a string or a list of strings", "stop")
    if tools:
        stop = [*stop, *fmt.stop]
    spec = CallSpec(max_tokens, temperature, tuple(dict.fromkeys(stop)))
    return messages, tools, spec
