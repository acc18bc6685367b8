"""The reward layer's composition: weighted components with their own values, the verdict
from the verifier, user reward files, timeouts and errors scored 0 and counted, and the
reward worker pool (real Ray actors) replacing a worker whose batch hangs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardConfig
from rlsys.placement.resources import ActorResources
from rlsys.rewards import REWARDS
from rlsys.rewards.scorer import Component, RewardScorer, merge
from rlsys.rewards.scoring import score_many
from rlsys.rewards.user import load_user_reward

USER_REWARDS = """
import asyncio
import time
from helper_mod import BONUS  # a helper module beside the file

def length_bonus(prompt, completion, metadata):
    return {"reward": BONUS * len(completion), "correct": completion == metadata["answer"]}

async def slow_async(prompt, completion, metadata):
    await asyncio.sleep(float(metadata.get("sleep", 0)))
    return 1.0

def hangs(prompt, completion, metadata):
    if completion == "hang":  # sleeps: a spinning thread would hold the GIL of the tests
        time.sleep(3600)
    if completion == "die":  # os._exit under another name
        import posix
        posix._exit(3)
    return 1.0

def wrong_arity(x):
    return 0

def exits(prompt, completion, metadata):
    import os, sys
    if completion == "os._exit":
        os._exit(3)
    if completion == "sys.exit":
        sys.exit(4)
    return 1.0
"""


@pytest.fixture
def user_file(tmp_path):
    (tmp_path / "helper_mod.py").write_text("BONUS = 0.5\n")
    path = tmp_path / "my_rewards.py"
    path.write_text(USER_REWARDS)
    return path


def test_components_are_weighted_and_the_verifier_decides_correct():
    cfg = RewardConfig(weight=2.0, extra={"format": 0.5}, format_pattern=r"\d+")
    scorer = RewardScorer.from_config("exact_match", cfg)
    good, bad, text = scorer.score(
        [
            ("p", "42", {"answer": "42"}),
            ("p", "41", {"answer": "42"}),
            ("p", "forty-two", {"answer": "42"}),
        ]
    )
    assert good.reward == 2.0 * 1 + 0.5 * 1 and good.correct
    assert good.components == {"exact_match": 1.0, "format": 1.0}
    assert bad.reward == 0.5 and not bad.correct and bad.error is None
    assert text.reward == 0.0 and text.components == {"exact_match": 0.0, "format": 0.0}


@dataclass(frozen=True)
class _LengthSettings:
    per_char: float = 1.0

    def __post_init__(self):
        if self.per_char <= 0:
            raise ValueError(f"per_char={self.per_char} must be > 0")


@pytest.fixture
def length_reward():
    """A reward with a setting of its own, registered for one test."""

    @REWARDS.register("length", settings=_LengthSettings)
    def length(prompt, completion, metadata, s: _LengthSettings) -> float:
        return s.per_char * len(completion)

    yield "length"
    REWARDS.unregister("length")


def test_a_reward_receives_its_own_settings_from_reward_args(length_reward):
    cfg = RewardConfig(extra={"length": 1.0}, args={"length": {"per_char": 0.5}})
    [out] = RewardScorer.from_config("exact_match", cfg).score([("p", "abcd", {"answer": ""})])
    assert out.components["length"] == 2.0
    # the flat key still feeds a built-in reward's settings; reward.args overrides it
    fmt = RewardConfig(
        extra={"format": 1.0}, format_pattern=r"\d+", args={"format": {"pattern": "x"}}
    )
    [out] = RewardScorer.from_config("exact_match", fmt).score([("p", "x", {"answer": ""})])
    assert out.components["format"] == 1.0
    with pytest.raises(ConfigError, match=r"reward.args.length.per_chr is not a setting of "):
        RewardScorer.from_config("length", RewardConfig(args={"length": {"per_chr": 1}}))
    with pytest.raises(ConfigError, match=r"reward.args.length: per_char=0 must be > 0"):
        RewardScorer.from_config("length", RewardConfig(args={"length": {"per_char": 0}}))
    with pytest.raises(ConfigError, match=r"reward.args.exact_match.x is not a setting of .*none"):
        RewardScorer.from_config("exact_match", RewardConfig(args={"exact_match": {"x": 1}}))
    with pytest.raises(ConfigError, match=r"reward.args.code_tests: code_tests reads its settings"):
        RewardScorer.from_config("code_tests", RewardConfig(args={"code_tests": {"wall_s": 1}}))
    with pytest.raises(ConfigError, match=r"reward.args.length: length is not a reward of this"):
        RewardScorer.from_config("exact_match", RewardConfig(args={"length": {"per_char": 1}}))


def test_user_reward_file_loads_with_its_helpers_sync_and_async(user_file):
    scorer = RewardScorer.from_config("exact_match", RewardConfig(fn=f"{user_file}:length_bonus"))
    [out] = scorer.score([("p", "abcd", {"answer": "abcd"})])
    assert out.reward == 2.0 and out.correct and out.components == {"user": 2.0}
    fn = load_user_reward(f"{user_file}:slow_async")
    [ok, late] = score_many(fn, [("p", "c", {}), ("p", "c", {"sleep": 5})], timeout_s=0.5)
    assert ok.reward == 1.0 and late.reward == 0.0 and "timeout" in late.error


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("missing.py:f", "is not a file"),
        ("{file}:nope", "has no function 'nope'"),
        ("{file}:wrong_arity", "must accept (prompt, completion, metadata)"),
        ("no_colon", "path/to/file.py:function"),
    ],
)
def test_bad_user_reward_specs_name_reward_fn(user_file, spec, needle):
    with pytest.raises(ConfigError, match="reward.fn") as info:
        RewardScorer.from_config("exact_match", RewardConfig(fn=spec.format(file=user_file)))
    assert needle in str(info.value)


def test_a_hanging_call_does_not_block_the_others(user_file):
    fn = load_user_reward(f"{user_file}:hangs")
    started = time.monotonic()
    items = [("p", "hang", {})] * 3 + [("p", "fine", {})] * 6
    outs = score_many(fn, items, timeout_s=0.5, concurrency=4)
    assert time.monotonic() - started < 5
    assert [o.reward for o in outs] == [0.0] * 3 + [1.0] * 6
    assert all("timeout" in o.error for o in outs[:3])


def test_a_user_reward_that_exits_scores_zero_and_the_process_lives_on(user_file):
    """os._exit on a reward thread would end the trainer with no message: it raises there
    instead. The same os._exit outside a reward call still exits (a child process checks)."""
    import subprocess
    import sys

    scorer = RewardScorer(
        [Component("user", load_user_reward(f"{user_file}:exits"), 1.0, True)], timeout_s=5.0
    )
    items = [("p", "os._exit", {}), ("p", "fine", {}), ("p", "sys.exit", {})]
    outs = scorer.score(items)
    assert [o.reward for o in outs] == [0.0, 1.0, 0.0] and [o.errors for o in outs] == [1, 0, 1]
    assert "called os._exit(3)" in outs[0].error and "SystemExit" in outs[2].error
    code = (
        f"from rlsys.rewards.user import load_user_reward; load_user_reward({str(user_file)!r}"
        " + ':exits'); import os; os._exit(7)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=user_file.parent).returncode == 7


def test_a_failing_component_scores_zero_and_counts_an_error():
    def broken(prompt, completion, metadata):
        raise RuntimeError("boom")

    class Batch:
        def score_batch(self, prompts, completions, metadatas):
            return [float("nan")] + [0.25] * (len(prompts) - 1)

    scorer = RewardScorer(
        [
            Component("exact_match", lambda p, c, m: 1.0, 1.0, True),
            Component("b", broken, 1.0),
            Component("rm", Batch(), 2.0),
        ],
        timeout_s=2.0,
    )
    first, second = scorer.score([("p", "c", {}), ("p", "c", {})])
    assert first.reward == 1.0 and first.errors == 2 and "boom" in first.error
    assert second.reward == 1.5 and second.errors == 1 and second.correct
    merged = merge([first], [second])
    assert merged[0].reward == 2.5 and merged[0].errors == 3 and merged[0].correct == first.correct


def test_reward_pool_scores_in_batches_and_replaces_a_stuck_worker(ray_cpu, user_file):
    from rlsys.rewards.pool import RewardPool

    cfg = RewardConfig(
        fn=f"{user_file}:hangs", num_workers=2, batch_size=2, timeout_s=1.0, num_cpus_per_worker=0.5
    )
    pool = RewardPool("exact_match", cfg, ActorResources(0.5, 0.0, 1))
    pool.batch_timeout_s = 3.0  # a stuck batch gives up quickly in this test
    try:
        outs = pool.score([("p", "ok", {})] * 5)
        assert [o.reward for o in outs] == [1.0] * 5 and pool.replaced == 0
        assert pool._next == 3  # batches went round robin, and the next call goes on from there
        outs = pool.score([("p", "hang", {}), ("p", "ok", {}), ("p", "ok", {})])
        # the hanging call times out inside the worker; its batch-mate still scores
        assert [o.reward for o in outs] == [0.0, 1.0, 1.0] and "timeout" in outs[0].error
        ray_cpu.kill(pool.workers[0])  # a worker that died: its batches score 0, replaced
        pool._next = 0  # its batch first
        outs = pool.score([("p", "ok", {})] * 4)
        assert [o.reward for o in outs] == [0.0, 0.0, 1.0, 1.0] and pool.replaced == 1
        assert "reward worker 0" in outs[0].error and outs[0].errors == 1
        assert [o.reward for o in pool.score([("p", "ok", {})] * 4)] == [1.0] * 4
        # a user reward that ends its process takes neither its worker nor its batch-mates
        outs = pool.score([("p", "die", {}), ("p", "ok", {})])
        assert [(o.reward, o.errors) for o in outs] == [(0.0, 1), (1.0, 0)], outs
        assert "exit status 3" in outs[0].error and pool.replaced == 1
    finally:
        pool.shutdown()
