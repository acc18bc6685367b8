"""``reward.judge``: an LLM judge through a real OpenAI-compatible server on this machine
(vLLM's, on the CPU stack, serving the built-in tiny model): verdicts parsed (forced into the
rubric's format with vLLM's structured outputs, since a random tiny model writes no verdict on
its own), a reply with no verdict counted as an error, identical requests judged once; and 2
training steps scored by a judge the run serves itself and by a ``reward.url`` service
(tests/e2e/reward_service.py, its first batch answered 503) together: one run for both, as
CI's minutes are counted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from reward_service import Service

from rlsys.config.reward import JudgeConfig
from rlsys.rewards.judge import JudgeReward
from rlsys.run.doctor_checks import TRAIN_OVERRIDES

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
FORCED = {"structured_outputs": {"regex": "SCORE: (10|[0-9])"}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def judge_url(tiny_model_dir, tmp_path_factory):
    """vLLM's OpenAI-compatible server on the built-in model, for this module."""
    port = _free_port()
    log = tmp_path_factory.mktemp("judge") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model_dir]
        + ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "judge"]
        + ["--max-model-len", "256", "--dtype", "float32", "--enforce-eager"],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            break
        except OSError:
            time.sleep(1)
    else:
        server.kill()
        pytest.fail(f"vLLM's server did not come up: {log.read_text()[-3000:]}")
    yield url
    server.terminate()
    server.wait(timeout=60)


ITEMS = (["2+2=", "3+4="], ["4", "9"], [{"answer": "4"}, {"answer": "7"}])


def test_verdicts_are_parsed_and_identical_requests_judged_once(judge_url):
    judge = JudgeReward(JudgeConfig(url=judge_url, max_tokens=8, extra_body=FORCED))
    first = judge.score_batch(*ITEMS)
    assert all(o.error is None and 0.0 <= o.reward <= 1.0 for o in first), first
    assert len(judge._cache) == 2
    start = time.monotonic()
    again = judge.score_batch(*ITEMS)
    assert [o.reward for o in again] == [o.reward for o in first]
    assert time.monotonic() - start < 0.05  # from the cache, no request


def test_a_reply_without_a_verdict_scores_zero_with_an_error(judge_url):
    judge = JudgeReward(JudgeConfig(url=judge_url, max_tokens=4))  # free text: no "SCORE"
    outcomes = judge.score_batch(*ITEMS)
    assert all(o.reward == 0.0 and "no verdict" in o.error for o in outcomes), outcomes
    wrong = JudgeReward(JudgeConfig(url=judge_url + "/nope", retries=0))
    (outcome,) = wrong.score_batch(["p"], ["c"], [{}])
    assert outcome.reward == 0.0 and "HTTP 404" in outcome.error


def test_two_training_steps_scored_by_a_served_judge_and_a_reward_service(
    tiny_model_dir, service, tmp_path
):
    """The judge here is one the run serves itself (``reward.judge.model_path``: an rlsys HF
    engine behind the same OpenAI-compatible API), the random built-in model with its verdict
    prefilled (``reward.judge.prefill``): a request that failed or a reply the judge did not
    continue would score 0 with an error, where every reply must get the prefilled 7 of 10."""
    result = subprocess.run(
        [sys.executable, "-m", "rlsys.cli", "train", *TRAIN_OVERRIDES]
        + ["learner.world_size=1", f"reward.url={service}/score"]
        + [f"reward.judge.model_path={tiny_model_dir}", "reward.judge.num_cpus=0.5"]
        + ["reward.judge.prefill='SCORE: 7\n'", "reward.judge.max_tokens=2"]
        + [f"run.output_dir={tmp_path}", "run.name=r"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    train = [s for s in map(json.loads, lines) if "reward/judge" in s]
    assert len(train) == 2
    for step in train:
        assert step["reward/judge"] == pytest.approx(0.7)
        assert 0.25 <= step["reward/remote"] <= 1.0  # only the service's two values
        assert step["rollout/reward_errors"] == 0  # the 503 was retried, not counted
    assert Service.failed_once and sum(Service.seen) >= 2 * 8 * 4
