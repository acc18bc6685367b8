"""The replay store of rare successes: what it keeps, what it puts into all-wrong groups,
its bounds, its checkpoint, the scoring loop's use of it and the buffer's accounting."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from rlsys.buffer.replay import ReplayStore
from rlsys.buffer.streaming import StreamingBuffer, has_reward_variance
from rlsys.checkpoint.state_file import read_state, write_state
from rlsys.config.buffer import ReplayConfig
from rlsys.config.errors import ConfigError
from rlsys.pipeline.scoring import ScoringLoop
from rlsys.resolve import load_config
from rlsys.types import Completion, Prompt, RolloutGroup, Sample

PROMPTS = [Prompt(uid, f"{uid}+1=", str(uid + 1)) for uid in range(4)]


def _group(uid: int, correct: list[bool], version: int = 0, tag: int = 0) -> RolloutGroup:
    """A scored group of prompt ``uid``: sample i has tokens [tag, i], logprobs -0.1 * (i+1)."""
    prompt = PROMPTS[uid]
    samples = [
        Sample(
            prompt,
            [1, 2],
            Completion([tag, i], [-0.1 * (i + 1)] * 2, "stop", version),
            "x",
            reward=float(right),
            correct=right,
        )
        for i, right in enumerate(correct)
    ]
    return RolloutGroup(prompt, samples)


def _store(**overrides) -> ReplayStore:
    return ReplayStore(ReplayConfig(enabled=True, **overrides))


def test_only_rare_successes_are_kept_and_only_after_commit():
    store = _store(max_pass_rate=0.25)
    assert store.offer(_group(0, [True, False, False, False], tag=7)) == 1  # 1/4: rare
    assert store.offer(_group(1, [True, True, False, False])) == 0  # 2/4: not rare
    assert store.offer(_group(2, [False] * 4)) == 0  # nothing to keep
    wrong = _group(0, [False] * 4, version=1)
    assert store.fill(wrong) is wrong  # staged, not in the store until the step boundary
    store.commit(version=1)
    assert store.metrics() == {"buffer/replay_prompts": 1, "buffer/replay_kept": 1}
    assert store.fill(_group(1, [False] * 4)).samples[-1].replayed is False


def test_an_all_wrong_group_takes_the_newest_successes_with_their_behaviour():
    store = _store(per_group=2, max_pass_rate=0.5)
    store.offer(_group(0, [True, False, False, False], version=0, tag=1))
    store.offer(_group(0, [False, True, False, False], version=2, tag=2))
    store.offer(_group(0, [False, False, True, False], version=3, tag=3))
    store.commit(version=3)
    wrong = _group(0, [False] * 4, version=4, tag=9)
    filled = store.fill(wrong)
    assert filled is not wrong and [s.replayed for s in filled.samples] == [0, 0, 1, 1]
    assert filled.samples[:2] == wrong.samples[:2]
    newest, older = filled.samples[2:]
    assert newest.completion.token_ids == [3, 2] and older.completion.token_ids == [2, 1]
    assert newest.completion.logprobs == [-0.30000000000000004] * 2  # behaviour kept
    assert (newest.completion.version, newest.reward, newest.correct) == (3, 1.0, True)
    assert filled.version == 4  # replayed samples do not make the group stale
    assert has_reward_variance(filled) and not has_reward_variance(wrong)
    # the filled group's own shaping and reference log-probs do not reach the store
    newest.reward, newest.ref_logprobs = -5.0, np.zeros(2)
    again = store.fill(_group(0, [False] * 4, version=4))
    assert again.samples[-2].reward == 1.0 and again.samples[-2].ref_logprobs is None


def test_a_group_with_a_success_or_a_prompt_without_any_is_left_alone():
    store = _store()
    store.offer(_group(0, [True, False, False, False]))
    store.commit(version=0)
    mixed = _group(0, [False, True, False, False])
    assert store.fill(mixed) is mixed
    other = _group(3, [False] * 4)
    assert store.fill(other) is other


def test_commit_is_order_free_and_bounds_age_count_and_prompts():
    groups = [_group(uid, [True, False, False, False], version=v, tag=v) for uid, v in
              [(0, 0), (1, 1), (0, 2), (2, 3), (0, 4), (1, 5)]]  # fmt: skip
    a, b = _store(per_prompt=2), _store(per_prompt=2)
    for g in groups:
        a.offer(g)
    for g in reversed(groups):
        b.offer(g)
    a.commit(5), b.commit(5)
    assert a.state_dict() == b.state_dict()
    kept = dict(a.state_dict()["kept"])
    assert [s.completion.version for s in kept[0]] == [2, 4]  # the newest per_prompt
    aged = _store(per_prompt=2, max_age=2)
    for g in groups:
        aged.offer(g)
    aged.commit(5)  # versions 0..2 are more than 2 behind 5
    assert {uid: [s.completion.version for s in v] for uid, v in aged.state_dict()["kept"]} == {
        0: [4],
        1: [5],
        2: [3],
    }
    few = _store(max_prompts=2)
    for g in groups:
        few.offer(g)
    few.commit(5)
    assert sorted(uid for uid, _ in few.state_dict()["kept"]) == [
        0,
        1,
    ]  # 2's newest success is oldest


def test_the_store_resumes_from_a_state_file_and_fills_the_same(tmp_path):
    store = _store(per_group=2)
    store.offer(_group(1, [False, False, False, True], version=3, tag=5))
    store.commit(4)
    store.offer(_group(2, [True, False, False, False], version=4, tag=6))  # staged only
    write_state(tmp_path / "state.json", store.state_dict())
    resumed = _store(per_group=2)
    resumed.load_state_dict(read_state(tmp_path / "state.json"))
    assert resumed.state_dict() == store.state_dict()
    for s in (store, resumed):
        s.commit(5)
    wrong = [_group(uid, [False] * 4, version=5) for uid in (1, 2)]
    assert [store.fill(g) for g in wrong] == [resumed.fill(g) for g in wrong]


def test_the_scoring_loop_trains_the_filled_group_and_reports_the_generated_one():
    """Through the scoring loop into the buffer: the learner gets the filled group, the
    window (metrics, curriculum) the group as generated, and the accounting balances with
    the replayed samples as their own source."""
    store = _store()
    store.offer(_group(0, [True, False, False, False], tag=3))
    store.commit(0)
    buffer = StreamingBuffer(2, 4, max_staleness=0, group_filter=has_reward_variance)
    groups: queue.Queue = queue.Queue()
    shaped: list[int] = []

    def shape(samples):
        shaped.extend(len(s.completion.token_ids) for s in samples)
        return 0.0

    loop = ScoringLoop(groups, buffer, lambda gs: None, shape, None, 0, lambda: 1, None, store)
    assert buffer.reserve(2) == 2
    generated = [_group(0, [False] * 4, version=0, tag=8), _group(1, [False] * 4)]
    for g in [*generated, None]:
        groups.put(g)
    loop.run()
    window, _, _ = loop.drain_window()
    assert window == generated  # as generated: no replayed sample there
    (kept,) = buffer.take(2)  # the prompt without kept successes stays all wrong: filtered
    assert [s.replayed for s in kept.samples] == [0, 0, 0, 1]
    assert len(shaped) == 4 + 4 + 1  # both generated groups, and the replayed sample once
    report = buffer.accounting()
    assert report["balanced"], report
    assert report["samples_issued"] == 8 and report["samples_replayed"] == 1
    assert report["samples_trained"] == 4
    assert report["samples_dropped"]["replaced"] == 1
    assert report["samples_dropped"]["filtered"] == 4


def test_replay_settings_are_checked():
    with pytest.raises(ConfigError, match="buffer.replay.max_pass_rate"):
        load_config(["buffer.replay.max_pass_rate=0"])
    with pytest.raises(ConfigError, match="algorithm.off_policy=tis"):
        load_config(["buffer.replay.enabled=true"])
    with pytest.raises(ConfigError, match="buffer.replay.per_group=4 must be below"):
        load_config(
            [
                "buffer.replay.enabled=true",
                "algorithm.off_policy=tis",
                "buffer.replay.per_group=4",
                "rollout.n_samples=4",
            ]
        )
    cfg = load_config(["buffer.replay.enabled=true", "algorithm.off_policy=tis"])
    assert cfg.buffer.replay.enabled and cfg.buffer.replay.per_group == 1
