"""JSON over HTTP for reward services and LLM judges: one POST, retried where a retry can help,
within one deadline; a failure raises ``RewardHTTPError`` saying why (never a traceback from
urllib)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

MAX_RESPONSE_BYTES = 16 << 20


class RewardHTTPError(RuntimeError):
    """No usable answer (the message says why)."""


class _Retry(Exception):
    pass


def bearer_headers(key_env: str | None) -> dict[str, str]:
    """JSON headers, with ``Authorization: Bearer $key_env`` where that variable is set."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    key = os.environ.get(key_env) if key_env else None
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def post_json(url: str, payload: dict, timeout_s: float, retries: int, key_env: str | None):
    """POST ``payload`` to ``url`` and return the decoded JSON answer. A refused connection, a
    timeout, 429 or a 5xx is retried up to ``retries`` times with backoff, all within
    ``timeout_s``; a 4xx, an answer that is not JSON or one over 16 MiB is not."""
    body = json.dumps(payload, default=str).encode()
    headers = bearer_headers(key_env)
    deadline = time.monotonic() + timeout_s
    attempt, last = 0, "no attempt"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise RewardHTTPError(f"{url}: no answer within {timeout_s:g} s ({last})")
        try:
            return _post(url, body, headers, left)
        except _Retry as exc:
            last = str(exc)
        attempt += 1
        if attempt > retries:
            raise RewardHTTPError(f"{url}: {last} (after {attempt} tries)")
        time.sleep(min(0.25 * 2**attempt, max(deadline - time.monotonic(), 0)))


def _post(url: str, body: bytes, headers: dict, timeout_s: float):
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            raw = response.read(MAX_RESPONSE_BYTES + 1)
    except urllib.error.HTTPError as exc:
        reason = f"HTTP {exc.code} {exc.reason}"
        if exc.code == 429 or exc.code >= 500:
            raise _Retry(reason) from None
        raise RewardHTTPError(f"{url}: {reason}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise _Retry(f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}") from None
    if len(raw) > MAX_RESPONSE_BYTES:
        raise RewardHTTPError(f"{url}: answer over {MAX_RESPONSE_BYTES >> 20} MiB")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise RewardHTTPError(f"{url}: answer is not JSON ({exc})") from None
