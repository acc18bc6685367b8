"""LLM-as-judge (``reward.judge``): each completion is graded by a judge model through an
OpenAI-compatible ``/chat/completions`` endpoint (vLLM's server, a hosted API, or the run's own
judge servers: ``reward.judge.model_path``, rlsys/rewards/judge_pool.py).

The rubric (``reward.judge.rubric``) is filled with the prompt, the completion and the row's
answer and sent as one user message; the first match of ``verdict_pattern`` in the reply is the
verdict (looked for in ``prefill`` + the reply, where the judge was asked to continue a reply
begun with ``prefill``), divided by ``max_score`` and clipped to [0, 1]. A reply with no verdict, an error
answer or no answer within ``timeout_s`` (retries included, ``rlsys.rewards.http``) scores 0
and counts one error; the run goes on. Requests run ``concurrency`` at a time, and an
identical (prompt, completion, answer) is judged once per process (``cache``)."""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from rlsys.config.reward import JudgeConfig
from rlsys.rewards.http import RewardHTTPError, post_json
from rlsys.rewards.scoring import RewardOutcome, short_text


class JudgeReward:
    """A batch scorer for ``RewardScorer``: batches of ``concurrency`` requests, each batch
    within ``timeout_s``."""

    def __init__(self, cfg: JudgeConfig):
        self.cfg = cfg
        self.batch_size, self.timeout_s = cfg.concurrency, cfg.timeout_s
        self.endpoints = [url.rstrip("/") + "/chat/completions" for url in cfg.urls()]
        self._turn = itertools.count()  # requests go round-robin over the endpoints
        self.verdict = re.compile(cfg.verdict_pattern)
        self._cache: dict[str, float] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="judge")

    def score_batch(self, prompts: list, completions: list, metadatas: list) -> list:
        jobs = [
            self._pool.submit(self._judge, p, c, str((m or {}).get("answer", "")))
            for p, c, m in zip(prompts, completions, metadatas, strict=True)
        ]
        return [job.result() for job in jobs]

    def _judge(self, prompt: str, completion: str, answer: str) -> RewardOutcome:
        key = hashlib.sha256("\0".join((prompt, completion, answer)).encode()).hexdigest()
        if self.cfg.cache:
            with self._lock:
                if key in self._cache:
                    return _scored(self._cache[key])
        try:
            reply = self._ask(
                self.cfg.rubric.format(prompt=prompt, completion=completion, answer=answer)
            )
        except RewardHTTPError as exc:
            return RewardOutcome(0.0, False, f"judge: {exc}")
        match = self.verdict.search(self.cfg.prefill + reply)
        if match is None:
            return RewardOutcome(0.0, False, f"judge: no verdict in {short_text(reply)}")
        score = min(max(float(match.group(1)) / self.cfg.max_score, 0.0), 1.0)
        if self.cfg.cache:
            with self._lock:
                self._cache[key] = score
        return _scored(score)

    def _ask(self, content: str) -> str:
        cfg = self.cfg
        messages = [{"role": "user", "content": content}]
        payload = {**cfg.extra_body}
        if cfg.prefill:  # the judge continues a reply begun for it
            messages.append({"role": "assistant", "content": cfg.prefill})
            payload.update(continue_final_message=True, add_generation_prompt=False)
        payload.update(
            model=cfg.model,
            messages=messages,
            max_tokens=cfg.max_tokens,
            temperature=cfg.temperature,
        )
        endpoint = self.endpoints[next(self._turn) % len(self.endpoints)]
        answer = post_json(endpoint, payload, cfg.timeout_s, cfg.retries, cfg.api_key_env)
        try:
            return str(answer["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            raise RewardHTTPError(
                f"{endpoint}: not a chat completion ({short_text(answer)})"
            ) from None


def _scored(score: float) -> RewardOutcome:
    """A judged score; the judge never decides ``correct`` (the task's verifier does)."""
    return RewardOutcome(score, False)
