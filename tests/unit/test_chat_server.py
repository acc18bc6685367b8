"""The OpenAI-compatible endpoint a run's own judge is served from (rlsys/rewards/
chat_server.py), over a real HF engine on the built-in tiny model: concurrent requests batched
into few generate calls, greedy replies equal to the engine's own, a reply begun by the client
continued, bad requests answered 400, and ``reward.judge`` spreading requests over two servers."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from rlsys.config.reward import JudgeConfig
from rlsys.config.rollout import RolloutConfig
from rlsys.engines import build_engine
from rlsys.models.loading import load_tokenizer
from rlsys.rewards.chat_server import ChatServer, render
from rlsys.rewards.judge import JudgeReward
from rlsys.types import SamplingParams


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """Two servers, each over its own engine (an engine is driven from one thread)."""
    tokenizer = load_tokenizer(tiny_model_dir)
    servers = [
        ChatServer(build_engine(tiny_model_dir, "float32", RolloutConfig()), tokenizer, "judge")
        for _ in range(2)
    ]
    yield servers, tokenizer
    for server in servers:
        server.shutdown()


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _chat(content: str, **more) -> dict:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **more}


def test_concurrent_requests_are_batched_and_greedy_replies_match_the_engine(served):
    (server, _), tokenizer = served[0], served[1]
    prompts = [f"{a}+{a}=" for a in range(12)]
    replies: dict[int, dict] = {}

    def ask(i: int) -> None:
        replies[i] = _post(server.url, _chat(prompts[i], max_tokens=4))[1]

    before = server.batches
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.batches - before < len(prompts)  # several requests per generate call
    ids = [render(tokenizer, [{"role": "user", "content": p}], False) for p in prompts]
    own = server.engine.generate(ids, SamplingParams(greedy=True, max_new_tokens=4))
    for i, (completion,) in enumerate(own):
        choice = replies[i]["choices"][0]
        assert choice["message"]["content"] == tokenizer.decode(
            completion.token_ids, skip_special_tokens=True
        )
        assert replies[i]["usage"]["completion_tokens"] == len(completion.token_ids) <= 4


def test_a_reply_begun_by_the_client_is_continued(served):
    (server, _), tokenizer = served[0], served[1]
    messages = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    body = {"messages": messages, "temperature": 0, "max_tokens": 3}
    status, reply = _post(server.url, {**body, "continue_final_message": True})
    assert status == 200
    ids = render(tokenizer, messages, True)
    text = tokenizer.decode(ids)
    assert "1+1=" in text and text.endswith("2")  # the reply's start, not closed: continued
    (completion,) = server.engine.generate([ids], SamplingParams(greedy=True, max_new_tokens=3))[0]
    assert reply["choices"][0]["message"]["content"] == tokenizer.decode(
        completion.token_ids, skip_special_tokens=True
    )


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "role 'tool'"),
        (_chat("x", max_tokens=0), "max_tokens=0"),
        (_chat("x", n=2), "n=1"),
        (_chat("x", continue_final_message=True), "assistant message last"),
    ],
)
def test_bad_requests_are_answered_400_naming_the_field(served, body, says):
    status, reply = _post(served[0][0].url, body)
    assert status == 400 and says in reply["error"]["message"]


def test_the_judge_spreads_requests_over_its_servers(served):
    servers, _ = served
    url = ",".join(s.url for s in servers)
    before = [s.batches for s in servers]
    judge = JudgeReward(
        JudgeConfig(url=url, prefill="SCORE: ", max_tokens=2, concurrency=1, cache=False)
    )
    outcomes = judge.score_batch(["1+1=", "2+2="], ["2", "4"], [{}, {}])
    assert [s.batches - b for s, b in zip(servers, before, strict=True)] == [1, 1]
    for outcome in outcomes:  # a verdict, or a reply without one: never an HTTP failure
        assert outcome.error is None or "no verdict" in outcome.error, outcome


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"url": "http://a/v1,ftp://b"}, "'ftp://b' is not an http"),
        ({"url": "http://a/v1", "model_path": "builtin:tiny"}, "both say where the judge is"),
        ({"model_path": "builtin:tiny", "engine": "sglang"}, "reward.judge.engine"),
        ({"model_path": "builtin:tiny", "num_workers": 0}, "reward.judge.num_workers"),
    ],
)
def test_judge_settings_that_cannot_work_are_refused(fields, says):
    from rlsys.config.errors import ConfigError

    with pytest.raises(ConfigError, match=says):
        JudgeConfig(**fields)
