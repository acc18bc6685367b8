"""How well an LLM judge tells right answers from wrong ones: what ``reward.judge`` would pay.

    python scripts/judge_agreement.py [--model gguf:smollm2-135m-instruct] [--items 100]
        [--seed 0] [--json out.json]

Starts vLLM's OpenAI-compatible server on the judge model (this machine, CPU stack), makes
``--items`` arithmetic questions (``a op b``, two-digit operands) and answers them, half right
and half wrong (off by 1-9, or the digits swapped), and grades each with rlsys's judge
(``rlsys.rewards.judge.JudgeReward``, the default rubric) twice: the reply as the model writes
it, and forced into ``SCORE: <0-10>`` with vLLM's structured outputs. Prints, for each: the
share of replies with a verdict, the mean score of right and of wrong answers, the agreement
of ``score >= 0.5`` with the truth, and the AUC (the chance a random right answer outscores a
random wrong one; 0.5 = no signal). Figures: docs/rewards.md."""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from rlsys.config.reward import JudgeConfig
from rlsys.config.schema import ModelConfig
from rlsys.models.loading import resolve_model_path
from rlsys.rewards.judge import JudgeReward

FORCED = {"structured_outputs": {"regex": "SCORE: (10|[0-9])"}}


def items(count: int, seed: int) -> list[tuple[str, str, dict, bool]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        a, b, op = rng.randint(10, 99), rng.randint(10, 99), rng.choice("+-*")
        truth = {"+": a + b, "-": a - b, "*": a * b}[op]
        right = i % 2 == 0
        shown = truth
        if not right:
            wrong = str(truth)[::-1] if rng.random() < 0.3 and len(str(abs(truth))) > 1 else ""
            shown = int(wrong) if wrong.lstrip("-").isdigit() and int(wrong) != truth else None
            shown = shown if shown is not None else truth + rng.choice([-1, 1]) * rng.randint(1, 9)
        out.append(
            (f"What is {a} {op} {b}?", f"The answer is {shown}.", {"answer": str(truth)}, right)
        )
    return out


def auc(right: list[float], wrong: list[float]) -> float:
    pairs = [(r > w) + 0.5 * (r == w) for r in right for w in wrong]
    return sum(pairs) / len(pairs)


def serve(model_dir: str, port: int, log) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    return subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir]
        + ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "judge"]
        + ["--max-model-len", "1024", "--dtype", "float32"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )


def grade(url: str, rows, extra: dict) -> dict:
    judge = JudgeReward(JudgeConfig(url=url, max_tokens=24, extra_body=extra, timeout_s=120))
    started = time.monotonic()
    outcomes = judge.score_batch([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    right = [o.reward for o, r in zip(outcomes, rows, strict=True) if r[3]]
    wrong = [o.reward for o, r in zip(outcomes, rows, strict=True) if not r[3]]
    agree = [(o.reward >= 0.5) == r[3] for o, r in zip(outcomes, rows, strict=True)]
    return {
        "verdict_rate": sum(o.error is None for o in outcomes) / len(outcomes),
        "mean_score_right": sum(right) / len(right),
        "mean_score_wrong": sum(wrong) / len(wrong),
        "agreement": sum(agree) / len(agree),
        "auc": auc(right, wrong),
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gguf:smollm2-135m-instruct")
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args()
    model_dir = resolve_model_path(ModelConfig(path=args.model))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = tempfile.mkstemp(prefix="judge-server-", suffix=".log")[1]
    with open(log_path, "w") as log:
        server = serve(model_dir, port, log)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/models", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(
                        f"judge_agreement: the server exited; see {log.name}"
                    ) from None
                time.sleep(1)
        rows = items(args.items, args.seed)
        report = {"model": args.model, "items": args.items, "seed": args.seed}
        for name, extra in (("free", {}), ("forced", FORCED)):
            report[name] = grade(url, rows, extra)
            print(f"judge_agreement: {name:6s} " + json.dumps(report[name]), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
