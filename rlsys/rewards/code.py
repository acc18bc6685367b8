"""The ``code_tests`` reward: run the completion's Python program in the sandbox on each test
case's stdin and compare its stdout with the expected output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rlsys.config.reward import RewardConfig, SandboxConfig
from rlsys.rewards.registry import REWARDS
from rlsys.rewards.sandbox import OUTPUT_LIMIT, check_sandbox, run_sandboxed
from rlsys.rewards.scoring import abandoned

# A fenced block: its language tag and body; an unclosed last fence runs to the end.
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("python", "python3", "py")


def extract_program(completion: str) -> str:
    """The last ```python fenced block of ``completion``, else its last fenced block, else
    the whole completion."""
    blocks = _FENCE.findall(completion)
    python = [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]
    if python:
        return python[-1]
    return blocks[-1][1] if blocks else completion


def _normalized(text: str) -> list[str]:
    """Output lines without trailing white space or trailing blank lines."""
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def parse_tests(metadata: dict) -> list[tuple[str, str]]:
    """``metadata["tests"]`` as (stdin, expected stdout) pairs: a list (or its JSON string)
    of {"input", "output"} dicts, or an {"inputs": [...], "outputs": [...]} dict."""
    tests = metadata.get("tests")
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except json.JSONDecodeError as exc:
            raise ValueError(f"metadata['tests'] is not valid JSON: {exc}") from exc
    if isinstance(tests, dict) and {"inputs", "outputs"} <= tests.keys():
        tests = [
            {"input": i, "output": o}
            for i, o in zip(tests["inputs"], tests["outputs"], strict=True)
        ]
    if not tests or not isinstance(tests, list):
        raise ValueError(
            "code_tests needs test cases in metadata['tests'] (the task's 'tests' column): "
            'a non-empty list of {"input": stdin, "output": expected stdout}'
        )
    try:
        return [(str(t["input"]), str(t["output"])) for t in tests]
    except (KeyError, TypeError) as exc:
        raise ValueError(
            f"metadata['tests'] entry is not an {{'input', 'output'}} dict: {exc!r}"
        ) from exc


class OutputCapError(RuntimeError):
    """A program's stdout passed its cap: its answer cannot be compared."""


@REWARDS.register("code_tests")
@dataclass
class CodeTests:
    """Fraction of ``metadata["tests"]`` the program passes; ``correct`` when all pass.

    After a test runs out of wall time the remaining tests are skipped and count as failed,
    so one call takes about ``reward.sandbox.wall_s`` plus the passing runs at most. A call
    the scorer gave up on (``reward.timeout_s``) kills its running test and starts no more.
    stdout is kept up to the expected output plus ``OUTPUT_LIMIT`` bytes; a program that
    exits well having printed more cannot be judged: the call raises ``OutputCapError``
    (the sample scores 0 with a counted reward error), rather than a silent 0."""

    sandbox: SandboxConfig

    @classmethod
    def from_config(cls, cfg: RewardConfig) -> CodeTests:
        """Build from ``reward.sandbox``; fails now if this machine cannot sandbox as set."""
        check_sandbox(cfg.sandbox)
        return cls(cfg.sandbox)

    def __call__(self, prompt: str, completion: str, metadata: dict) -> dict:
        tests = parse_tests(metadata)
        program = extract_program(completion)
        passed = 0
        for number, (stdin, expected) in enumerate(tests):
            if abandoned():
                break
            cap = len(expected.encode("utf-8", errors="replace")) + OUTPUT_LIMIT
            result = run_sandboxed(program, stdin, self.sandbox, cap)
            if result.ok and result.stdout_truncated:
                raise OutputCapError(
                    f"test {number}: the program printed more than the output cap ({cap} "
                    f"bytes: the expected output + {OUTPUT_LIMIT // 1024} KiB), so its output "
                    "cannot be judged"
                )
            if result.ok and _normalized(result.stdout) == _normalized(expected):
                passed += 1
            if result.timed_out:
                break
        return {"reward": passed / len(tests), "correct": passed == len(tests)}
