"""The planner's discrete-event simulator: hand-computed timelines, and the buffer's admission
and staleness invariants (the cases of tests/unit/test_buffer.py, replayed through the
simulator, which drives a real ``StreamingBuffer``)."""

from __future__ import annotations

import pytest

from rlsys.plan.cores import SharedCores
from rlsys.plan.costs import CostsError, StageCosts
from rlsys.plan.simulator import Simulation, simulate
from rlsys.plan.workload import Placement, ReplyLengths, Workload, WorkloadError

# one call generates a batch in 1 s, the learner trains in 0.5 s, a weight sync takes 0.1 s
CLOCK = StageCosts(gen_call_s=1.0, train_call_s=0.5, sync_call_s=0.1)


def _work(**kw) -> Workload:
    return Workload(**{"batch_size": 4, "n_samples": 2, "total_steps": 3, **kw})


def test_synchronous_steps_are_generation_then_learner_then_sync():
    pred = simulate(CLOCK, _work(), Placement(max_staleness=0))
    assert pred.wall_s == pytest.approx(3 * (1.0 + 0.5 + 0.1))
    assert pred.trained_samples == 3 * 4 * 2
    assert pred.samples_per_s == pytest.approx(24 / 4.8)
    assert pred.staleness == {0: 1.0}
    # the learner waits the whole generation, the worker the learner's 0.6 s of every step
    assert pred.learner_idle_frac == pytest.approx(1.0 / 1.6)
    assert pred.step_s == pytest.approx(1.6)


def test_one_step_off_overlaps_and_the_gate_waits_for_the_running_call():
    # batch 2 generates while the learner trains on batch 1; the weight update at 1.5 s waits
    # for that call (ends at 2.0), syncs until 2.1; batch 3 runs 2.1-3.1, the learner's second
    # update waits for it until 3.1, syncs until 3.2; step 3 trains and syncs until 3.8.
    # Batch 1 (version 0) trains at version 0; batches 2 (v0) and 3 (v1) one version behind.
    pred = simulate(CLOCK, _work(), Placement(max_staleness=1))
    assert pred.wall_s == pytest.approx(3.8)
    assert pred.gate_wait_s == pytest.approx((0.5 + 0.5 + 0.0) / 3)
    assert pred.staleness == {0: pytest.approx(1 / 3), 1: pytest.approx(2 / 3)}


def test_one_core_shared_by_every_stage_gains_nothing_from_overlap():
    shared = StageCosts(**{**CLOCK.to_dict(), "host_cores": 1})
    sync = simulate(shared, _work(), Placement(max_staleness=0))
    overlapped = simulate(shared, _work(), Placement(max_staleness=1))
    assert overlapped.wall_s == pytest.approx(sync.wall_s) == pytest.approx(4.8)
    two_cores = StageCosts(**{**CLOCK.to_dict(), "host_cores": 2})
    assert simulate(two_cores, _work(), Placement(max_staleness=1)).wall_s == pytest.approx(3.8)


def test_partial_rollouts_abort_at_the_update_and_keep_the_first_tokens_version():
    costs = StageCosts(gen_token_s=0.25, train_call_s=0.5, sync_call_s=0.1)
    work = _work(lengths=ReplyLengths((4,)), batch_size=1, n_samples=1, total_steps=4)
    waiting = simulate(costs, work, Placement(max_staleness=1))
    partial = simulate(costs, work, Placement(max_staleness=1, partial=True))
    assert partial.gate_wait_s == 0.0 < waiting.gate_wait_s
    assert partial.samples_continued > 0 and waiting.samples_continued == 0
    assert max(partial.staleness) <= 1  # the oldest token's version bounds it


@pytest.mark.parametrize("staleness", [0, 1, 2, 3])
@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("partial", [False, True])
def test_no_trained_sample_is_staler_than_the_bound(staleness, workers, partial):
    costs = StageCosts(gen_token_s=0.01, gen_call_s=0.05, train_call_s=0.3, score_group_s=0.01)
    work = _work(lengths=ReplyLengths((2, 10, 40)), batch_size=6, total_steps=12)
    pred = simulate(costs, work, Placement(workers, 1, staleness, partial), seed=staleness)
    assert max(pred.staleness) <= staleness
    assert pred.trained_samples == 12 * 6 * 2
    assert pred.accounting_balanced


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_what_runs_ahead_never_exceeds_the_admission_window(staleness):
    # test_buffer.py: test_async_admission_bounds_what_runs_ahead, at every event of a run
    sim = Simulation(
        StageCosts(gen_call_s=0.2, train_call_s=1.0),
        _work(total_steps=8),
        Placement(rollout_workers=4, max_staleness=staleness),
    )
    seen = []
    original = sim._feed

    def watched_feed() -> None:
        original()
        stats = sim.buffer.stats
        live_groups = (stats.issued - stats.released - sum(stats.dropped.values())) // 2
        seen.append(live_groups)

    sim._feed = watched_feed
    sim.run()
    assert max(seen) == (staleness + 1) * 4


def test_synchronous_admission_issues_nothing_before_the_weight_update():
    # test_buffer.py: test_synchronous_admission_waits_for_the_weight_update -- in the
    # simulator, no generation overlaps the learner: each step is generation, then learner
    costs = StageCosts(gen_sequence_s=1 / 8, train_call_s=0.5, sync_call_s=0.1)
    pred = simulate(costs, _work(total_steps=5), Placement(rollout_workers=2, max_staleness=0))
    assert pred.wall_s == pytest.approx(5 * (0.5 + 0.5 + 0.1))  # two workers, 4 samples each


def test_sample_budget_ends_the_run_and_the_buffer_runs_dry():
    # test_buffer.py: test_sample_budget_ends_issuing_and_the_buffer_runs_dry (6 groups of 2)
    pred = simulate(CLOCK, _work(max_groups=6, total_steps=10), Placement(max_staleness=2))
    assert pred.steps == 2 and pred.trained_samples == 12
    assert pred.accounting_balanced and sum(pred.dropped.values()) == 0


def test_total_steps_bound_what_is_issued():
    # test_buffer.py: test_total_steps_bound_what_is_issued
    sim = Simulation(CLOCK, _work(total_steps=1), Placement(max_staleness=2))
    sim.run()
    assert sim.buffer.stats.issued == 4 * 2  # one step's batch, not (2 + 1) batches


def test_filtered_groups_are_refilled_up_to_the_draw_rounds():
    # test_buffer.py: test_dropped_groups_free_their_slot_up_to_the_draw_rounds
    work = _work(filtered_frac=0.6, draw_rounds=2, total_steps=20)
    sim = Simulation(CLOCK, work, Placement(max_staleness=0), seed=1)
    pred = sim.run()
    stats = sim.buffer.stats
    drawn_groups = (stats.issued - stats.dropped["stale"]) // 2  # stale drops refill freely
    assert drawn_groups <= 2 * 4 * 20
    assert pred.dropped["filtered"] > 0
    assert pred.trained_samples < 20 * 4 * 2  # short batches once the rounds are spent
    assert pred.accounting_balanced


def test_colocated_engines_sleep_while_the_learner_trains():
    costs = StageCosts(**{**CLOCK.to_dict(), "engine_sleep_s": 0.2, "engine_wake_s": 0.3})
    pred = simulate(costs, _work(), Placement(max_staleness=1, colocated=True))
    # nothing overlaps the learner's work: each step is generation, sleep, train, wake, sync
    # (the next batch's generation may only overlap the gate-free gaps)
    assert pred.wall_s >= 3 * (0.2 + 0.5 + 0.3 + 0.1) + 1.0
    assert pred.wall_s > simulate(costs, _work(), Placement(max_staleness=1)).wall_s


def test_the_same_seed_gives_the_same_prediction():
    costs = StageCosts(gen_token_s=0.01, train_token_s=0.001, score_group_s=0.01)
    work = _work(lengths=ReplyLengths.parse("mean=50,max=400"), total_steps=6)
    place = Placement(rollout_workers=2, max_staleness=1)
    assert simulate(costs, work, place, seed=3) == simulate(costs, work, place, seed=3)


def test_length_distributions_parse_with_their_mean_and_cut():
    lengths = ReplyLengths.parse("mean=600,max=4096")
    assert lengths.mean == pytest.approx(600, rel=0.02)
    assert max(lengths.values) <= 4096 and min(lengths.values) >= 1
    assert ReplyLengths.parse("10,20").values == (10, 20)
    with pytest.raises(WorkloadError, match="--task-lengths"):
        ReplyLengths.parse("mean=600")
    with pytest.raises(WorkloadError, match="unknown key"):
        ReplyLengths.parse("mean=6,max=9,p=1")


def test_bad_costs_and_placements_name_the_key():
    with pytest.raises(CostsError, match="gen_call_s"):
        StageCosts(gen_call_s=-1.0)
    with pytest.raises(CostsError, match="unknown cost key"):
        StageCosts.from_dict({"gen_cal_s": 1.0})
    with pytest.raises(WorkloadError, match="max_staleness"):
        Placement(max_staleness=-1)


def test_shared_cores_split_their_speed_among_running_jobs():
    events: list = []
    clock = {"now": 0.0}
    cores = SharedCores(lambda: clock["now"], lambda d, a: events.append((clock["now"] + d, a)), 1)
    finished = {}

    def run_next() -> None:
        events.sort(key=lambda e: e[0])
        clock["now"], action = events.pop(0)
        action()

    cores.start(1.0, lambda: finished.setdefault("a", clock["now"]))
    job_b = cores.start(2.0, lambda: finished.setdefault("b", clock["now"]))
    while "a" not in finished:
        run_next()
    assert finished["a"] == pytest.approx(2.0)  # half speed while both ran
    assert cores.stop(job_b) == pytest.approx(1.0)  # b did 1 s of its 2 s
