"""``reward.url``: a reward service over HTTP (rlsys/rewards/remote.py), against a real local
server: 2 training steps scored by it (a 503 on its first batch retried), and a service that
answers badly or not at all scoring 0 with a counted error, never stopping the scorer."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlsys.config.reward import RewardConfig
from rlsys.rewards.scorer import RewardScorer

ROOT = Path(__file__).resolve().parents[2]
TRAIN = [
    "warm_start.enabled=false",
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    "eval.num_prompts=16",
    "data.batch_size=8",
    "rollout.n_samples=4",
    "algorithm.filter_uniform_groups=false",
    "learner.world_size=1",
]


class _Service(http.server.BaseHTTPRequestHandler):
    """Scores 1.0 a completion holding a digit, else 0.25; fails its first batch with 503
    (the client retries) and answers 400 to a path other than /score."""

    seen: list[int] = []
    failed_once = False

    def do_POST(self):  # noqa: N802 (http.server's name)
        items = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["items"]
        if self.path != "/score":
            self.send_response(400)
            self.end_headers()
            return
        cls = type(self)
        if not cls.failed_once:
            cls.failed_once = True
            self.send_response(503)
            self.end_headers()
            return
        cls.seen.append(len(items))
        scores = [1.0 if any(ch.isdigit() for ch in i["completion"]) else 0.25 for i in items]
        body = json.dumps({"scores": scores}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    _Service.seen, _Service.failed_once = [], False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.timeout(600)
def test_two_training_steps_scored_by_a_reward_service(tmp_path, service):
    result = subprocess.run(
        [sys.executable, "-m", "rlsys.cli", "train", *TRAIN, f"reward.url={service}/score"]
        + [f"run.output_dir={tmp_path}", "run.name=r"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [
        json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [s for s in steps if "reward/remote" in s]
    assert len(train) == 2
    for step in train:
        assert 0.25 <= step["reward/remote"] <= 1.0  # only the service's two values
        assert step["rollout/reward_errors"] == 0  # the 503 was retried, not counted
    assert _Service.failed_once and sum(_Service.seen) >= 2 * 8 * 4


def _scorer(url: str, timeout_s: float = 10.0) -> RewardScorer:
    cfg = RewardConfig(url=url, timeout_s=timeout_s, url_retries=1, batch_size=4)
    return RewardScorer.from_config("exact_match", cfg)


def test_a_service_that_refuses_or_is_silent_scores_zero_with_an_error(service):
    outcomes = _scorer(f"{service}/wrong").score([("p", "c1", {}), ("p", "c2", {})])
    assert [o.reward for o in outcomes] == [0.0, 0.0]
    assert all(o.errors == 1 and "HTTP 400" in o.error for o in outcomes)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/score"
        outcomes = _scorer(url, timeout_s=1.0).score([("p", "c", {})])
    finally:
        silent.close()
    assert outcomes[0].reward == 0.0 and outcomes[0].errors == 1
    assert "within 1 s" in outcomes[0].error or "timeout" in outcomes[0].error


def test_a_bad_url_is_refused_naming_the_key():
    with pytest.raises(Exception, match=r"reward.url='ftp://x' is not an http"):
        RewardConfig(url="ftp://x")
    with pytest.raises(Exception, match="both replace the task's verifier"):
        RewardConfig(url="http://x", fn="f.py:g")
