"""The streaming buffer: staleness bound, filter hook, admission control and accounting."""

from __future__ import annotations

import threading

import pytest

from rlsys.buffer.streaming import StreamingBuffer, has_reward_variance
from rlsys.types import Completion, Prompt, RolloutGroup, Sample


def _group(rewards=(0.0, 1.0), version=0):
    prompt = Prompt(0, "1+1=", "2")
    samples = [
        Sample(prompt, [1], Completion([2], [-0.1], "stop", version), "x", r) for r in rewards
    ]
    return RolloutGroup(prompt, samples)


def _reserve(buffer: StreamingBuffer, k: int, wait_s: float = 0.2) -> int | None:
    """``buffer.reserve(k)``, or None if it is still blocked after ``wait_s``."""
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(buffer.reserve(k)), daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        buffer.close()  # unblock it (returns 0) so the thread ends
        thread.join(5)
        return None
    return got[0]


def test_stale_groups_are_refused_and_counted():
    buffer = StreamingBuffer(batch_size=4, group_size=2, max_staleness=0)
    assert buffer.reserve(4) == 4
    buffer.step_done(policy_version=3)
    assert buffer.put(_group(version=3))
    assert not buffer.put(_group(version=2))
    assert buffer.stats.dropped_stale == 2 and buffer.stats.admitted == 2
    # a queued group that the next version makes stale is dropped (and counted) at once
    buffer.step_done(policy_version=4)
    assert len(buffer) == 0 and buffer.stats.dropped_stale == 4


def test_filter_hook_and_fifo_order():
    buffer = StreamingBuffer(4, 2, max_staleness=1, group_filter=has_reward_variance)
    assert buffer.reserve(3) == 3
    a, b = _group([0, 1]), _group([1, 0.5])
    assert not buffer.put(_group([1, 1]))
    buffer.put(a)
    buffer.put(b)
    assert buffer.stats.dropped_filtered == 2
    assert buffer.take(1) == [a]
    assert buffer.take(1) == [b]
    assert len(buffer) == 0


def test_synchronous_admission_waits_for_the_weight_update():
    buffer = StreamingBuffer(batch_size=4, group_size=2, max_staleness=0)
    assert buffer.reserve(10) == 4  # one batch, no more
    for _ in range(4):
        buffer.put(_group())
    assert len(buffer.take(4)) == 4
    # the learner has the batch but has not updated the engines yet: nothing may be issued
    assert _reserve(buffer, 1) is None


def test_next_batch_is_admitted_after_step_done():
    buffer = StreamingBuffer(batch_size=4, group_size=2, max_staleness=0)
    assert buffer.reserve(4) == 4
    for _ in range(4):
        buffer.put(_group())
    buffer.take(4)
    buffer.step_done(policy_version=1)
    assert _reserve(buffer, 10) == 4


@pytest.mark.parametrize("staleness", [1, 2])
def test_async_admission_bounds_what_runs_ahead(staleness):
    batch = 4
    buffer = StreamingBuffer(batch, group_size=2, max_staleness=staleness)
    assert buffer.reserve(100) == (staleness + 1) * batch
    assert _reserve(buffer, 1) is None


def _dynamic(batch_size: int, draw_rounds: int) -> StreamingBuffer:
    """A synchronous buffer that drops tied groups and refills their slots (dynamic sampling)."""
    return StreamingBuffer(
        batch_size,
        group_size=2,
        max_staleness=0,
        group_filter=has_reward_variance,
        draw_rounds=draw_rounds,
    )


def test_dropped_groups_free_their_slot_up_to_the_draw_rounds():
    buffer = _dynamic(batch_size=2, draw_rounds=2)
    assert buffer.reserve(10) == 2
    assert not buffer.put(_group([1, 1]))  # filtered: its slot is refilled ...
    assert buffer.reserve(10) == 1
    assert not buffer.put(_group([1, 1]))
    assert not buffer.put(_group([0, 0]))
    assert buffer.reserve(10) == 1  # ... until 2 rounds x 2 prompts are drawn
    assert not buffer.put(_group([0, 0]))
    assert _reserve(buffer, 1) is None


def test_take_returns_a_short_batch_when_nothing_more_can_arrive():
    buffer = StreamingBuffer(
        batch_size=4, group_size=2, max_staleness=0, group_filter=has_reward_variance
    )
    assert buffer.reserve(4) == 4
    buffer.put(_group([0, 1]))
    buffer.put(_group([1, 1]))
    buffer.put(_group([0, 1]))
    assert buffer.in_flight == 1
    buffer.put(_group([1, 1]))
    assert len(buffer.take(4)) == 2  # starved: the two kept groups


def test_a_short_batch_leaves_no_slots_behind():
    """With dynamic sampling (draw_rounds > 1) a step that trained on fewer groups than the
    batch size is over: the next step is issued one batch, not one batch plus the last one's
    empty slots (those used to run on the old policy during the update and then arrived
    stale, every step, on the learner's cores)."""
    buffer = _dynamic(batch_size=4, draw_rounds=3)
    drawn = 0
    while buffer.room():
        granted = buffer.reserve(100)
        for i in range(granted):  # the first two groups have variance, the rest tie
            buffer.put(_group([0, 1] if drawn + i < 2 else [1, 1]))
        drawn += granted
    assert drawn == 12 and len(buffer.take(4)) == 2  # 3 rounds x 4 drawn, 2 kept
    buffer.step_done(policy_version=1)
    assert buffer.reserve(100) == 4  # one batch
    for _ in range(4):
        assert buffer.put(_group([0, 1], version=1))
    assert len(buffer.take(4)) == 4 and buffer.in_flight == 0
    assert _reserve(buffer, 1) is None  # nothing runs beside the update


def test_sample_budget_ends_issuing_and_the_buffer_runs_dry():
    buffer = StreamingBuffer(batch_size=4, group_size=2, max_staleness=2, max_groups=6)
    assert buffer.reserve(100) == 6
    assert buffer.reserve(1) == 0  # spent: the feeder ends
    for _ in range(6):
        buffer.put(_group())
    assert len(buffer.take(4)) == 4 and not buffer.exhausted()
    assert len(buffer.take(4)) == 2 and buffer.exhausted()


def test_total_steps_bound_what_is_issued():
    buffer = StreamingBuffer(batch_size=2, group_size=2, max_staleness=2, max_steps=1)
    assert buffer.reserve(100) == 2  # one step's batch, not (2 + 1) batches


def test_accounting_balances_with_a_reason_per_drop():
    buffer = StreamingBuffer(4, 2, max_staleness=0, group_filter=has_reward_variance)
    assert buffer.reserve(4) == 4
    buffer.cancel(1, "prompt_too_long")
    buffer.put(_group([1, 1]))  # filtered
    buffer.put(_group([0, 1]))
    assert not buffer.accounting()["balanced"]  # one group still in flight
    buffer.cancel(1, "failed")
    assert len(buffer.take(4)) == 1
    report = buffer.accounting()
    assert report["balanced"]
    assert report["samples_issued"] == 8 and report["samples_trained"] == 2
    assert report["samples_dropped"] == {
        "stale": 0,
        "filtered": 2,
        "failed": 2,
        "prompt_too_long": 2,
        "unused": 0,
        "replaced": 0,
    }
    with pytest.raises(ValueError, match="drop reason"):
        buffer.cancel(1, "lost")


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_room_and_ready_say_what_reserve_and_take_would_do_without_waiting(staleness):
    # the planner's simulator drives the buffer with these instead of blocking calls
    buffer = StreamingBuffer(batch_size=4, group_size=2, max_staleness=staleness)
    assert buffer.room() == (staleness + 1) * 4
    assert buffer.reserve(100) == (staleness + 1) * 4
    assert buffer.room() == 0
    assert not buffer.ready(4)  # nothing queued, groups in flight
    for _ in range(4):
        buffer.put(_group())
    assert buffer.ready(4)
    assert buffer.ready(5) == (staleness == 0)  # synchronous: nothing more can arrive
    assert len(buffer.take(4)) == 4
    assert buffer.room() == 0  # no room until the step is done, whatever the bound
    buffer.step_done(policy_version=1)
    assert buffer.room() == 4
    buffer.pause()
    assert buffer.room() == 0
    buffer.resume()
    buffer.close()
    assert buffer.room() == 0 and buffer.ready(4)
