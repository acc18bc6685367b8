"""The pipeline's loops with small deterministic fake engines (no Ray): staleness and
admission invariants, synchronous mode never overlapping, partial rollouts recording the
version of every token, failures surfacing, and the sample accounting balancing."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.data.sampler import PromptSampler
from rlsys.pipeline import Pipeline, RolloutSide, ScoringSide
from rlsys.types import Completion, Prompt, RolloutGroup, Sample, SamplingParams

BATCH, N, MAX_NEW = 4, 2, 6


class FakeEngines:
    """Rollout workers that take ``token_s`` per token and emit token id 100 + their weights'
    version, so every token says which version produced it. ``abort`` ends running calls
    early with ``finish_reason="abort"``, as the real engines do."""

    def __init__(self, num_workers: int, token_s: float, fail_on_call: int | None = None):
        self.version = 0
        self.token_s = token_s
        self.fail_on_call = fail_on_call
        self._aborting = [threading.Event() for _ in range(num_workers)]
        self._lock = threading.Lock()
        self.running = 0
        self.calls = 0
        self.calls_by_worker: Counter = Counter()
        self.overlapped = False  # a call ran while the learner trained

    def generate_on(self, worker, prompt_ids, sampling, seed, budgets):
        flag = self._aborting[worker]
        flag.clear()
        with self._lock:
            self.calls += 1
            self.calls_by_worker[worker] += 1
            if self.calls == self.fail_on_call:
                raise RuntimeError("engine died")
            self.running += 1
        version = self.version
        budgets = budgets or [sampling.max_new_tokens] * len(prompt_ids)
        made = 0
        while made < max(budgets) and not flag.is_set():
            time.sleep(self.token_s)
            made += 1
        with self._lock:
            self.running -= 1
        out = []
        for budget in budgets:
            length = min(made, budget)
            reason = "length" if length == budget else "abort"
            out.append(
                [
                    Completion([100 + version] * length, [-0.5] * length, reason, version)
                    for _ in range(sampling.n)
                ]
            )
        return out

    def abort(self):
        for flag in self._aborting:
            flag.set()


def _build_groups(prompts, prompt_ids, completions, baseline=None):
    return [
        RolloutGroup(p, [Sample(p, ids, c, "") for c in group])
        for p, ids, group in zip(prompts, prompt_ids, completions, strict=True)
    ]


def _score(groups):
    for group in groups:
        for i, sample in enumerate(group.samples):
            sample.reward = float(i % 2)  # every group has reward variance


def _pipeline(engines, buffer, num_workers=2, partial=False, per_request=None):
    prompts = [Prompt(i, f"p{i}", "0") for i in range(50)]
    rollout = RolloutSide(
        lambda ps: (ps, [[1, 2, 3] for _ in ps]),
        engines.generate_on,
        engines.abort,
        num_workers,
        _build_groups,
        SamplingParams(n=N, max_new_tokens=MAX_NEW),
        prompts_per_request=per_request,
        partial=partial,
    )
    scoring = ScoringSide(_score, lambda samples: 0.0)
    sampler = PromptSampler(prompts, BATCH, shuffle=False, seed=0)
    return Pipeline(buffer, sampler, rollout, scoring)


def _learn(pipeline, engines, buffer, steps, train_s, check):
    """The learner's loop: take a batch, check it, 'train', update the engines' weights."""
    version = 0
    for _ in range(steps):
        kept = buffer.take(BATCH)
        pipeline.raise_if_failed()
        check(kept, version)
        running_before = engines.running
        time.sleep(train_s)
        if buffer.max_staleness == 0 and (running_before or engines.running):
            engines.overlapped = True
        with pipeline.gate.shut():
            version += 1
            engines.version = version
        buffer.step_done(version)
    return version


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_staleness_bound_and_admission_hold(staleness):
    engines = FakeEngines(num_workers=2, token_s=0.002)
    buffer = StreamingBuffer(BATCH, N, staleness)
    pipeline = _pipeline(engines, buffer)
    lags: list[int] = []

    def check(kept, version):
        assert len(kept) == BATCH
        for group in kept:
            assert len(group.samples) == N  # groups are released complete
            for sample in group.samples:
                assert sample.completion.finish_reason == "length"
                lags.append(version - sample.completion.version)
        # in flight plus queued never exceeds what the bound allows
        assert buffer.in_flight + len(buffer) <= (staleness + 1) * BATCH

    pipeline.start()
    try:
        _learn(pipeline, engines, buffer, steps=6, train_s=0.03, check=check)
    finally:
        pipeline.stop()
    assert max(lags) <= staleness
    if staleness == 0:
        assert set(lags) == {0} and not engines.overlapped
    else:
        assert max(lags) >= 1  # generation really ran ahead of the learner
    report = buffer.accounting()
    assert report["balanced"], report
    assert report["samples_trained"] == 6 * BATCH * N


def test_partial_rollouts_continue_under_new_weights_with_per_token_versions():
    # one long request per worker, so the weight update always lands mid-generation
    engines = FakeEngines(num_workers=1, token_s=0.02)
    buffer = StreamingBuffer(BATCH, N, max_staleness=1)
    pipeline = _pipeline(engines, buffer, num_workers=1, partial=True, per_request=BATCH)
    spans = []

    def check(kept, version):
        for group in kept:
            for sample in group.samples:
                c = sample.completion
                assert len(c.token_ids) == MAX_NEW and c.finish_reason == "length"
                assert len(c.logprobs) == MAX_NEW
                # token id 100 + v was made by version v: the recorded versions agree
                assert c.versions() == [t - 100 for t in c.token_ids]
                assert c.versions() == sorted(c.versions())
                assert c.version == min(c.versions()) and version - c.version <= 1
                spans.append(len(set(c.versions())))

    pipeline.start()
    try:
        # each step trains while the next request is a few tokens in, then updates weights
        _learn(pipeline, engines, buffer, steps=4, train_s=0.05, check=check)
    finally:
        pipeline.stop()
    assert max(spans) == 2, "no sample was continued under newer weights"
    assert pipeline.samples_continued > 0
    assert buffer.accounting()["balanced"]


def test_without_partial_rollouts_requests_finish_on_their_weights():
    engines = FakeEngines(num_workers=1, token_s=0.01)
    buffer = StreamingBuffer(BATCH, N, max_staleness=1)
    pipeline = _pipeline(engines, buffer, num_workers=1, partial=False, per_request=BATCH)

    def check(kept, version):
        for group in kept:
            for sample in group.samples:
                assert len(set(sample.completion.versions())) == 1
                assert len(sample.completion.token_ids) == MAX_NEW

    pipeline.start()
    try:
        _learn(pipeline, engines, buffer, steps=3, train_s=0.03, check=check)
    finally:
        pipeline.stop()
    assert pipeline.samples_continued == 0
    assert buffer.accounting()["balanced"]
    # each call decoded its longest reply: MAX_NEW tokens, less in a call the stop aborted
    steps = pipeline.pool_metrics()["rollout/decode_steps"]
    assert (engines.calls - 1) * MAX_NEW <= steps <= engines.calls * MAX_NEW
    assert steps >= 3 * MAX_NEW  # the three batches trained on were decoded in full


def test_stopping_mid_run_counts_in_flight_samples_as_unused():
    engines = FakeEngines(num_workers=2, token_s=0.05)
    buffer = StreamingBuffer(BATCH, N, max_staleness=2)
    pipeline = _pipeline(engines, buffer)
    pipeline.start()
    time.sleep(0.1)  # requests are running
    pipeline.stop()
    report = buffer.accounting()
    assert report["balanced"], report
    assert report["samples_dropped"]["unused"] == report["samples_issued"] > 0


def test_a_failing_engine_stops_the_pipeline_and_is_counted():
    engines = FakeEngines(num_workers=2, token_s=0.001, fail_on_call=3)
    buffer = StreamingBuffer(BATCH, N, max_staleness=1)
    pipeline = _pipeline(engines, buffer, per_request=1)
    pipeline.start()
    with pytest.raises(RuntimeError, match="engine died"):
        _learn(pipeline, engines, buffer, steps=5, train_s=0.01, check=lambda k, v: None)
    pipeline.stop()
    report = buffer.accounting()
    assert report["balanced"], report
    assert report["samples_dropped"]["failed"] == N


def test_the_rollout_pool_grows_and_shrinks_mid_run_without_losing_samples():
    engines = FakeEngines(num_workers=3, token_s=0.004)
    buffer = StreamingBuffer(BATCH, N, max_staleness=1)
    pipeline = _pipeline(engines, buffer, num_workers=1)
    pipeline.start()
    try:
        _learn(pipeline, engines, buffer, steps=2, train_s=0.02, check=lambda k, v: None)
        assert set(engines.calls_by_worker) == {0}
        for worker in (1, 2):
            pipeline.add_rollout(worker)
        assert pipeline.feeder.per_request == 2  # ceil(BATCH / 3): every worker gets work
        _learn(pipeline, engines, buffer, steps=3, train_s=0.02, check=lambda k, v: None)
        assert set(engines.calls_by_worker) == {0, 1, 2}, "the new loops took no requests"
        assert pipeline.retire_rollouts(2) == [1, 2]
        assert [loop.worker for loop in pipeline.rollouts] == [0]
        deadline = time.monotonic() + 10
        while (gone := pipeline.retired()) is None:  # they finish the request they hold
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert gone == [1, 2]
        before = dict(engines.calls_by_worker)
        _learn(pipeline, engines, buffer, steps=3, train_s=0.02, check=lambda k, v: None)
        after = dict(engines.calls_by_worker)
        assert after[1] == before[1] and after[2] == before[2], "a retired loop kept working"
        assert after[0] > before[0]
    finally:
        pipeline.stop()
    report = buffer.accounting()
    assert report["balanced"], report
    assert report["samples_trained"] == 8 * BATCH * N
    assert report["samples_dropped"]["failed"] == 0


def test_a_nested_shut_keeps_the_gate_shut_until_the_outer_block_ends():
    """Engines asleep around a weight update: the update's own shut must not reopen the gate
    while the outer block (the learner's work) still holds it."""
    from rlsys.pipeline.gate import RolloutGate

    gate = RolloutGate(abort=lambda: None, partial=False)
    entered = threading.Event()

    def request():
        gate.enter()
        entered.set()
        gate.leave()

    with gate.shut():
        with gate.shut():
            pass
        loop = threading.Thread(target=request)
        loop.start()
        assert not entered.wait(0.2)  # still held by the outer block
    assert entered.wait(5.0)  # the outer block's end let it through
    loop.join()
