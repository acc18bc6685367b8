"""A reward service over HTTP (``reward.url``): batches of (prompt, completion, metadata) are
POSTed as JSON and the service answers with one score per item.

Request::

    POST <reward.url>   {"items": [{"prompt": "...", "completion": "...", "metadata": {...}}]}

Response (200)::

    {"scores": [0.5, {"reward": 1.0, "correct": true}, ...]}   # one per item, in order

A score is a number or ``{"reward": x, "correct": bool}`` (as a user reward returns). Each
batch gets ``reward.timeout_s`` in all; a connection failure, a timeout, 429 or a 5xx is
retried (``reward.url_retries`` times, with backoff) within that; a 4xx or a malformed answer
is not (``rlsys.rewards.http``). A batch that fails scores 0 for each of its items with one
counted error each (``RewardScorer``); the run goes on. ``Authorization: Bearer
$<reward.url_key_env>`` is sent where that variable is set."""

from __future__ import annotations

from rlsys.rewards.http import RewardHTTPError, post_json


class RemoteReward:
    """The ``reward.url`` verifier: ``score_batch`` for ``RewardScorer``, chunked by
    ``batch_size``."""

    def __init__(
        self, url: str, batch_size: int, timeout_s: float, retries: int, key_env: str | None
    ):
        self.url, self.batch_size, self.timeout_s = url, batch_size, timeout_s
        self.retries, self.key_env = retries, key_env

    def score_batch(self, prompts: list, completions: list, metadatas: list) -> list:
        items = [
            {"prompt": p, "completion": c, "metadata": m}
            for p, c, m in zip(prompts, completions, metadatas, strict=True)
        ]
        answer = post_json(self.url, {"items": items}, self.timeout_s, self.retries, self.key_env)
        scores = answer.get("scores") if isinstance(answer, dict) else None
        if not isinstance(scores, list) or len(scores) != len(items):
            got = len(scores) if isinstance(scores, list) else "no 'scores' list"
            raise RewardHTTPError(f"{self.url}: {got} scores for {len(items)} items")
        return scores
