"""Faults of reward functions that must not end a run (issue 47): values that are not finite
numbers are refused per sample, and a user reward (``reward.fn``) that ends its process
(``os._exit`` by any name, ``sys.exit``, a segfault) scores 0 with a counted error while the
scorer lives on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlsys.config.reward import RewardConfig
from rlsys.rewards.registry import exact_match
from rlsys.rewards.scorer import Component, RewardScorer, components_from_config, merge

# ---- (10) values that are not finite numbers -------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        10**400,  # an int too big for a float
        10**5000,  # too big even for repr (Python's int-to-text limit)
        float("inf"),
        float("-inf"),
        float("nan"),
        {"reward": 10**400},
        {"reward": float("inf"), "correct": True},
        {"reward": 1.0, "correct": float("nan")},
        {"reward": 1.0, "correct": "no"},
        {"correct": True},  # no reward
        "1.0",  # text, not a number
        None,
        [1.0],
        object(),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, int) else repr(v)[:40],
)
def test_a_reward_that_is_not_a_finite_number_scores_zero_and_counts(value):
    def odd(prompt, completion, metadata):
        return value if completion == "odd" else 1.0

    scorer = RewardScorer([Component("user", odd, 1.0, True)], timeout_s=5.0)
    bad, good = scorer.score([("p", "odd", {}), ("p", "fine", {})])
    assert (bad.reward, bad.correct, bad.errors) == (0.0, False, 1) and bad.error
    assert bad.components == {"user": 0.0} and len(bad.error) < 500
    assert (good.reward, good.correct, good.errors) == (1.0, True, 0)


def test_batch_scores_that_are_not_finite_numbers_score_zero_and_count():
    class Batch:
        def __init__(self, scores):
            self.scores = scores

        def score_batch(self, prompts, completions, metadatas):
            return self.scores

    items = [("p", "c", {}), ("p", "c", {})]
    huge = RewardScorer([Component("rm", Batch([10**400, 0.5]), 1.0)], timeout_s=5.0)
    assert [(o.reward, o.errors) for o in huge.score(items)] == [(0.0, 1), (0.5, 0)]
    not_a_list = RewardScorer([Component("rm", Batch(3.0), 1.0)], timeout_s=5.0)
    assert [(o.reward, o.errors) for o in not_a_list.score(items)] == [(0.0, 1), (0.0, 1)]


def test_a_weighted_total_that_overflows_scores_zero_and_counts():
    scorer = RewardScorer(
        [Component("a", lambda p, c, m: 1e308, 10.0, True), Component("b", exact_match, 1.0)],
        timeout_s=5.0,
    )
    [out] = scorer.score([("p", "x", {"answer": "x"})])
    assert out.reward == 0.0 and out.errors == 1 and "not finite" in out.error
    [total] = merge([out], [out])
    assert total.reward == 0.0
    big = merge(*[[type(out)(1e308, True)]] * 2)[0]
    assert big.reward == 0.0 and big.errors == 1


# ---- (11) user rewards that end their process ------------------------------------------

DYING_REWARDS = """
import ctypes
import os
import posix
import sys

def dies(prompt, completion, metadata):
    if completion == "posix._exit":
        posix._exit(3)  # os._exit under another name: not the guarded os._exit
    if completion == "os._exit":
        os._exit(5)
    if completion == "sys.exit":
        sys.exit(4)
    if completion == "segfault":
        ctypes.string_at(0)
    if completion == "hold the GIL":
        ctypes.PyDLL(None).sleep(60)  # C code that keeps the GIL: no thread can run
    return 1.0

def where(prompt, completion, metadata):
    return {"reward": 1.0, "correct": os.getpid() != metadata["trainer_pid"]}
"""

SCORE_IN_A_TRAINER = """
import json, sys
from rlsys.config.reward import RewardConfig
from rlsys.rewards.scorer import RewardScorer

scorer = RewardScorer.from_config("exact_match", RewardConfig(fn=sys.argv[1], timeout_s=10.0))
rounds = []
for completions in (sys.argv[2].split(","), ["ok", "ok"]):
    outs = scorer.score([("p", c, {}) for c in completions])
    rounds.append([[o.reward, o.errors, o.error] for o in outs])
print(json.dumps(rounds))
"""


@pytest.fixture
def dying_file(tmp_path):
    path = tmp_path / "dying_rewards.py"
    path.write_text(DYING_REWARDS)
    return path


def test_a_user_reward_that_ends_its_process_scores_zero_and_the_trainer_lives_on(dying_file):
    """Run as its own trainer process: before the fix the first ``posix._exit`` ended it."""
    deaths = ["posix._exit", "ok", "segfault", "sys.exit", "os._exit", "ok", "posix._exit"]
    proc = subprocess.run(
        [sys.executable, "-c", SCORE_IN_A_TRAINER, f"{dying_file}:dies", ",".join(deaths)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 0, f"the trainer died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    first, after = json.loads(proc.stdout.splitlines()[-1])
    assert [r for r, _, _ in first] == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    assert [n for _, n, _ in first] == [1, 0, 1, 1, 1, 0, 1]
    assert "exit status 3" in first[0][2] and "SIGSEGV" in first[2][2], first
    assert "SystemExit" in first[3][2] and "os._exit(5)" in first[4][2], first
    assert after == [[1.0, 0, None], [1.0, 0, None]]


def test_user_rewards_run_in_a_child_process_and_built_ins_in_this_one(dying_file):
    scorer = RewardScorer.from_config("exact_match", RewardConfig(fn=f"{dying_file}:where"))
    [out] = scorer.score([("p", "c", {"trainer_pid": os.getpid()})])
    assert out.correct and out.errors == 0, out
    [builtin] = components_from_config("exact_match", RewardConfig())
    assert builtin.fn is exact_match


def test_a_user_reward_file_that_ends_its_process_on_import_names_reward_fn(tmp_path):
    """In a trainer process of its own: before the fix the import ended it."""
    path = tmp_path / "exits_on_import.py"
    path.write_text("import posix\nposix._exit(9)\n")
    code = (
        "from rlsys.config.errors import ConfigError\n"
        "from rlsys.config.reward import RewardConfig\n"
        "from rlsys.rewards.scorer import RewardScorer\n"
        "try:\n"
        f"    RewardScorer.from_config('exact_match', RewardConfig(fn={str(path)!r} + ':f'))\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the trainer died (rc {proc.returncode}): {proc.stderr}"
    assert "reward.fn=" in proc.stdout and "exit status 9" in proc.stdout, proc.stdout


def test_the_child_process_is_reused_across_calls(dying_file):
    scorer = RewardScorer.from_config("exact_match", RewardConfig(fn=f"{dying_file}:dies"))
    [user] = scorer.components
    outs = scorer.score([("p", "ok", {})] * 20) + scorer.score([("p", "ok", {})] * 3)
    assert [o.reward for o in outs] == [1.0] * 23 and user.fn.restarts == 0
    [dead, ok] = scorer.score([("p", "posix._exit", {}), ("p", "ok", {})])
    assert (dead.reward, dead.errors, ok.reward, ok.errors) == (0.0, 1, 1.0, 0)
    assert user.fn.restarts >= 1


def test_a_call_stuck_holding_the_gil_is_killed_and_scored_as_timed_out(dying_file, monkeypatch):
    from rlsys.rewards import user_process

    monkeypatch.setattr(user_process, "ANSWER_GRACE_S", 0.5)
    cfg = RewardConfig(fn=f"{dying_file}:dies", timeout_s=0.5)
    scorer = RewardScorer.from_config("exact_match", cfg)
    [stuck] = scorer.score([("p", "hold the GIL", {})])
    assert (stuck.reward, stuck.errors) == (0.0, 1) and "was killed" in stuck.error, stuck
    [ok] = scorer.score([("p", "ok", {})])
    assert (ok.reward, ok.errors) == (1.0, 0)


def test_isolation_overhead_is_small(dying_file):
    """Scoring through the child process costs well under a millisecond per sample here
    (about 25 us in chunks of 8; the bound is loose for a loaded 2-core machine)."""
    import time

    scorer = RewardScorer.from_config("exact_match", RewardConfig(fn=f"{dying_file}:dies"))
    items = [("p", "ok", {})] * 256
    scorer.score(items)  # warm
    start = time.perf_counter()
    scorer.score(items)
    assert (time.perf_counter() - start) / len(items) < 0.005
