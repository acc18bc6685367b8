"""An OpenAI-compatible chat endpoint over one rlsys engine: what a run's own judge pool serves
(``reward.judge.model_path``, rlsys/rewards/judge_pool.py).

``POST /v1/chat/completions`` (non-streaming, n=1: ``messages``, ``max_tokens`` /
``max_completion_tokens``, ``temperature``, and vLLM's ``continue_final_message`` /
``add_generation_prompt``, which let a client start the reply itself) and ``GET /v1/models``.
Messages are rendered with the tokenizer's chat template (a tokenizer without one: the contents,
a line each). Requests that arrive while the engine is busy wait and go to it together, one
``generate`` call per batch of at most ``max_batch``, so a judge with ``concurrency`` requests in
flight fills the engine's batch; the engine is called from the batching thread only, as the
engine interface asks. HTTP, bad bodies (OpenAI-style 400s) and failures (500, the server goes
on) are ``rlsys.run.json_http``'s, as for the agents' endpoint.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

from rlsys.run.json_http import JsonServer, RequestError, read_json
from rlsys.types import SamplingParams

log = logging.getLogger(__name__)
WAIT_S = 600.0  # a request not answered by then gets 500


@dataclass
class _Call:
    ids: list[int]
    max_tokens: int
    temperature: float
    done: threading.Event = field(default_factory=threading.Event)
    text: str = ""
    tokens: int = 0
    finish: str = "stop"
    error: str | None = None


def render(tokenizer, messages: list[dict], continue_final: bool) -> list[int]:
    """Token ids of ``messages`` as the model reads them: its chat template with a generation
    prompt, or continuing the last (assistant) message where ``continue_final``."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not continue_final,
            continue_final_message=continue_final,
        )
    else:
        text = "\n".join(m["content"] for m in messages)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def parse_request(body: dict, tokenizer) -> _Call:
    """The generation a chat-completions ``body`` asks for; raises RequestError (400) naming
    the field."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list of {role, content}")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise RequestError(400, "each message needs a string 'content' (text only)")
        if m.get("role") not in ("system", "user", "assistant"):
            raise RequestError(
                400, f"message role {m.get('role')!r} is not system, user or assistant"
            )
    if body.get("n", 1) != 1 or body.get("stream"):
        raise RequestError(400, "only n=1 and non-streaming requests are served")
    continue_final = bool(body.get("continue_final_message", False))
    if continue_final and messages[-1]["role"] != "assistant":
        raise RequestError(400, "continue_final_message needs an assistant message last")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
    temperature = body.get("temperature", 1.0)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(400, f"max_tokens={max_tokens!r} must be a positive integer")
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise RequestError(400, f"temperature={temperature!r} must be a number >= 0")
    return _Call(render(tokenizer, messages, continue_final), max_tokens, float(temperature))


class ChatServer:
    """The endpoint over ``engine`` (an rlsys ``RolloutEngine``) at ``url``."""

    def __init__(
        self, engine, tokenizer, name: str, host: str = "127.0.0.1", max_batch: int = 32
    ) -> None:
        self.engine, self.tokenizer, self.name, self.max_batch = engine, tokenizer, name, max_batch
        self.calls: queue.Queue[_Call] = queue.Queue()
        self.batches = 0  # generate calls made (requests batched together count once)
        self._stop = threading.Event()
        self.http = JsonServer(self._route, "chat server", host)
        threading.Thread(target=self._batch, daemon=True, name="chat-gen").start()

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.http.url}/v1"

    def shutdown(self) -> None:
        self._stop.set()
        self.http.shutdown()

    def _route(self, method: str, path: str, body: bytes) -> dict:
        route = (method, path.split("?")[0].rstrip("/"))
        if route == ("GET", "/v1/models"):
            models = [{"id": self.name, "object": "model", "owned_by": "rlsys"}]
            return {"object": "list", "data": models}
        if route == ("POST", "/v1/chat/completions"):
            return self.complete(read_json(body))
        raise RequestError(404, f"no route {method} {path}")

    def complete(self, body: dict) -> dict:
        """The chat completion for ``body``; raises RequestError or RuntimeError."""
        call = parse_request(body, self.tokenizer)
        self.calls.put(call)
        if not call.done.wait(WAIT_S):
            raise RuntimeError(f"no generation within {WAIT_S:g} s")
        if call.error is not None:
            raise RuntimeError(call.error)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": call.text},
                    "finish_reason": call.finish,
                }
            ],
            "usage": {
                "prompt_tokens": len(call.ids),
                "completion_tokens": call.tokens,
                "total_tokens": len(call.ids) + call.tokens,
            },
        }

    def _batch(self) -> None:
        """Take the waiting calls, a batch at a time, and generate each batch at once (calls
        with different temperatures go in separate batches: one ``SamplingParams`` a call)."""
        while not self._stop.is_set():
            try:
                first = self.calls.get(timeout=0.2)
            except queue.Empty:
                continue
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.calls.get_nowait())
                except queue.Empty:
                    break
            for temperature in sorted({c.temperature for c in batch}):
                self._generate([c for c in batch if c.temperature == temperature])

    def _generate(self, calls: list[_Call]) -> None:
        temperature = calls[0].temperature
        sampling = SamplingParams(
            n=1,
            greedy=temperature == 0.0,
            temperature=temperature or 1.0,
            max_new_tokens=max(c.max_tokens for c in calls),
        )
        try:
            out = self.engine.generate(
                [c.ids for c in calls], sampling, [c.max_tokens for c in calls]
            )
            self.batches += 1
            for call, (completion,) in zip(calls, out, strict=True):
                call.tokens = len(completion.token_ids)
                call.finish = "length" if completion.finish_reason == "length" else "stop"
                call.text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        except Exception as exc:  # noqa: BLE001 - answered as a 500, the server goes on
            log.exception("chat server: generation failed")
            for call in calls:
                call.error = f"{type(exc).__name__}: {exc}"
        for call in calls:
            call.done.set()
