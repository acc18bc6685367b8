"""The OpenAI-compatible endpoint, driven by the real ``openai`` client: a chat completion over
the real HF engine on the tiny model (text, usage, the exact ids and logprobs recorded, the
next call reusing them), a generated tool call returned as ``tool_calls``, and OpenAI-style
400/404/503 errors that leave the server serving."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import openai
import pytest

from rlsys.agents.server import AgentServer
from rlsys.envs.tool_formats import HermesFormat
from rlsys.models.loading import load_tokenizer
from rlsys.types import Completion, SamplingParams


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)  # its chat template: builtin.CHAT_TEMPLATE


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    import torch

    from rlsys.config.schema import RolloutConfig
    from rlsys.engines.hf import HFEngine

    return HFEngine(tiny_model_dir, "float32", RolloutConfig(), torch.device("cpu"))


@pytest.fixture
def server(tokenizer):
    # the template does not render tools: hermes declares them in the system turn itself
    srv = AgentServer(tokenizer, HermesFormat(native=False))
    yield srv
    srv.shutdown()


def _client(server: AgentServer, session) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url(session), api_key="x", max_retries=0)


def test_a_chat_completion_over_the_hf_engine_is_recorded_exactly(server, engine, tokenizer):
    returned: list[Completion] = []

    def generate(session, ids, spec):
        params = SamplingParams(max_new_tokens=spec.max_tokens or 8, seed=3, stop=list(spec.stop))
        returned.append(engine.generate([ids], params)[0][0])
        return returned[-1]

    session = server.open(generate)
    client = _client(server, session)
    messages = [{"role": "user", "content": "12+7="}]
    reply = client.chat.completions.create(model="m", messages=messages, max_tokens=6)

    [call] = session.calls
    [engine_out] = returned
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert call.prompt_ids == tokenizer.encode(prompt, add_special_tokens=False)
    assert call.token_ids == engine_out.token_ids and 0 < len(call.token_ids) <= 6
    assert call.logprobs == engine_out.logprobs and all(lp <= 0.0 for lp in call.logprobs)
    assert call.versions == [engine.version] * len(call.token_ids)
    text = tokenizer.decode(engine_out.token_ids, skip_special_tokens=True)
    assert reply.choices[0].message.content == text
    assert reply.usage.prompt_tokens == len(call.prompt_ids)
    assert reply.usage.completion_tokens == len(call.token_ids)
    assert reply.choices[0].finish_reason in ("stop", "length")

    # the agent sends its conversation on: the next prompt reuses the generated ids as they were
    messages += [reply.choices[0].message.model_dump(exclude_none=True)]
    messages += [{"role": "user", "content": "and 1+1="}]
    client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    first, second = session.calls
    turn = first.token_ids[: first.turn_len]  # less a trailing EOS: the template ends the turn
    assert set(first.token_ids[first.turn_len :]) <= set(tokenizer.all_special_ids)
    head = first.prompt_ids + turn
    assert second.prompt_ids[: len(head)] == head and len(second.prompt_ids) > len(head)


def _scripted(tokenizer, texts: list[str], seen: list):
    """A generate that answers each call with the next of ``texts`` (tool-call tests only)."""

    def generate(session, ids, spec):
        seen.append((ids, spec))
        tokens = tokenizer.encode(texts[len(seen) - 1], add_special_tokens=False)
        return Completion(tokens, [-0.5] * len(tokens), "stop", 7)

    return generate


TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}


def test_a_generated_tool_call_comes_back_as_tool_calls(server, tokenizer):
    call_text = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+3"}}\n</tool_call>'
    seen: list = []
    session = server.open(_scripted(tokenizer, [call_text, "It is 5."], seen))
    client = _client(server, session)
    messages = [{"role": "user", "content": "2+3?"}]
    reply = client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    [tool_call] = choice.message.tool_calls
    assert tool_call.function.name == "calc"
    assert json.loads(tool_call.function.arguments) == {"expression": "2+3"}
    assert "</tool_call>" in seen[0][1].stop  # the turn stops at a complete call
    assert '"name": "calc"' in tokenizer.decode(seen[0][0])  # the tools were declared

    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "5"})
    final = client.chat.completions.create(model="m", messages=messages, tools=[TOOL])
    assert final.choices[0].message.content == "It is 5."
    assert final.choices[0].finish_reason == "stop"
    first, second = session.calls
    # the assistant turn went back as the model's exact tokens, then the tool result
    head = first.prompt_ids + first.token_ids
    assert second.prompt_ids[: len(head)] == head
    assert "<tool_response>\n5\n</tool_response>" in tokenizer.decode(
        second.prompt_ids[len(head) :]
    )
    assert session.tool_calls == 1


def _post(url: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, tokenizer):
    seen: list = []
    session = server.open(_scripted(tokenizer, ["ok"], seen))
    client = _client(server, session)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="m", messages=[])
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}], n=2)
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model="m", messages=[{"role": "robot", "content": "a"}])
    url = f"{server.base_url(session)}/chat/completions"
    status, body = _post(url, b"{not json")
    assert status == 400 and "not JSON" in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"
    status, body = _post(url, b'{"messages": [{"role": "user", "content": "a"}], "stream": true}')
    assert status == 400 and body["error"]["param"] == "stream"
    stranger = openai.OpenAI(base_url=f"{server.url}/sessions/nope/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="unknown or closed"):
        stranger.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    assert _post(f"{server.url}/v2/anything", b"{}")[0] == 404
    assert not seen  # nothing reached the engine
    # still serving: a good request goes through, and the model list answers
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    assert reply.choices[0].message.content == "ok"
    assert [m.id for m in client.models.list()] == ["rlsys-policy"]
    server.close(session)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])


def test_a_run_that_ends_answers_503(server):
    session = server.open(lambda session, ids, spec: None)
    with pytest.raises(openai.InternalServerError, match="ending"):
        _client(server, session).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "a"}]
        )
    assert not session.calls
