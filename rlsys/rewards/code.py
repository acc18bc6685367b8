"""The ``code_tests`` reward: run the completion's Python program in the sandbox on each test
case's stdin and compare its stdout with the expected output."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rlsys.config.reward import RewardConfig, SandboxConfig
from rlsys.rewards.registry import REWARDS
from rlsys.rewards.sandbox import check_sandbox, run_sandboxed
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


@REWARDS.register("code_tests")
@dataclass
class CodeTests:
    """Fraction of ``metadata["tests"]`` the program passes; ``correct`` when all pass.

    After a test runs out of wall time the remaining tests are skipped and count as failed,
    so one call takes about ``reward.sandbox.wall_s`` plus the passing runs at most. A call
    the scorer gave up on (``reward.timeout_s``) kills its running test and starts no more."""

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
        for stdin, expected in tests:
            if abandoned():
                break
            result = run_sandboxed(program, stdin, self.sandbox)
            if result.ok and _normalized(result.stdout) == _normalized(expected):
                passed += 1
            if result.timed_out:
                break
        return {"reward": passed / len(tests), "correct": passed == len(tests)}
