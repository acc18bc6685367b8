"""``reward.url``: a reward service over HTTP (rlsys/rewards/remote.py), against a real local
server: a service that answers badly or not at all scores 0 with a counted error, never
stopping the scorer. Its 2 training steps (a 503 on its first batch retried) run with the
judge's, in tests/e2e/test_judge_reward.py (the service: tests/e2e/reward_service.py)."""

from __future__ import annotations

import socket

import pytest

from rlsys.config.reward import RewardConfig
from rlsys.rewards.scorer import RewardScorer

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
