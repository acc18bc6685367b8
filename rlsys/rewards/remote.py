"""A reward service over HTTP (``reward.url``): batches of (prompt, completion, metadata) are
POSTed as JSON and the service answers with one score per item.

Request::

    POST <reward.url>   {"items": [{"prompt": "...", "completion": "...", "metadata": {...}}]}

Response (200)::

    {"scores": [0.5, {"reward": 1.0, "correct": true}, ...]}   # one per item, in order

A score is a number or ``{"reward": x, "correct": bool}`` (as a user reward returns). Each
batch gets ``reward.timeout_s`` in all; a connection failure, a timeout, 429 or a 5xx is
retried (``reward.url_retries`` times, with backoff) within that; a 4xx or a malformed answer
is not. A batch that fails scores 0 for each of its items with one counted error each
(``RewardScorer``); the run goes on. ``Authorization: Bearer $<reward.url_key_env>`` is sent
where that variable is set."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

MAX_RESPONSE_BYTES = 16 << 20


class RemoteRewardError(RuntimeError):
    """The service did not give a usable answer (the message says why)."""


class RemoteReward:
    """The ``reward.url`` verifier: ``score_batch`` for ``RewardScorer``, chunked by
    ``batch_size``."""

    def __init__(
        self, url: str, batch_size: int, timeout_s: float, retries: int, key_env: str | None
    ):
        self.url, self.batch_size, self.timeout_s, self.retries = (
            url,
            batch_size,
            timeout_s,
            retries,
        )
        self.key_env = key_env

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.key_env) if self.key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def score_batch(self, prompts: list, completions: list, metadatas: list) -> list:
        items = [
            {"prompt": p, "completion": c, "metadata": m}
            for p, c, m in zip(prompts, completions, metadatas, strict=True)
        ]
        body = json.dumps({"items": items}, default=str).encode()
        deadline = time.monotonic() + self.timeout_s
        attempt, last = 0, None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteRewardError(
                    f"{self.url}: no answer within {self.timeout_s:g} s ({last})"
                )
            try:
                return self._post(body, len(items), left)
            except _Retry as exc:
                last = exc.reason
            attempt += 1
            if attempt > self.retries:
                raise RemoteRewardError(f"{self.url}: {last} (after {attempt} tries)")
            time.sleep(min(0.25 * 2**attempt, max(deadline - time.monotonic(), 0)))

    def _post(self, body: bytes, count: int, timeout_s: float) -> list:
        request = urllib.request.Request(self.url, data=body, headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code} {exc.reason}"
            if exc.code == 429 or exc.code >= 500:
                raise _Retry(reason) from None
            raise RemoteRewardError(f"{self.url}: {reason}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise _Retry(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None
        if len(raw) > MAX_RESPONSE_BYTES:
            raise RemoteRewardError(f"{self.url}: answer over {MAX_RESPONSE_BYTES >> 20} MiB")
        try:
            scores = json.loads(raw)["scores"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RemoteRewardError(
                f"{self.url}: answer is not JSON with a 'scores' list ({exc})"
            ) from None
        if not isinstance(scores, list) or len(scores) != count:
            got = len(scores) if isinstance(scores, list) else type(scores).__name__
            raise RemoteRewardError(f"{self.url}: {got} scores for {count} items")
        return scores


class _Retry(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason
