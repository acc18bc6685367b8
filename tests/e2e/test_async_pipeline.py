"""Asynchronous training end to end with real Ray actors, with each rollout engine: the
staleness bound holds, weight updates interrupt running requests and their samples continue
under the new weights (partial rollouts), and summary.json's accounting balances."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("engine", [pytest.param("hf", marks=pytest.mark.long), "vllm"])
def test_async_run_with_partial_rollouts(engine, run_controller):
    staleness = 2
    summary, records = run_controller(
        [
            f"rollout.engine={engine}",
            "rollout.num_cpus_per_worker=1",
            "learner.world_size=1",
            "learner.num_cpus_per_rank=1",
            "placement=disaggregated",
            f"buffer.max_staleness={staleness}",
            "rollout.partial_rollouts=true",
            "rollout.prompts_per_request=2",  # many short requests: updates land mid-request
            "rollout.stop_token_ids=[]",
            "task.max_new_tokens=64",  # the untrained model rarely stops: requests outlast a step
            "trainer.total_steps=6",
            "data.batch_size=4",
            "rollout.n_samples=4",
            "eval.num_prompts=8",
            "algorithm.filter_uniform_groups=false",
            "algorithm.off_policy=decoupled",
            "task.reward=digit_fraction",
        ]
    )
    assert summary["steps"] == 6 and summary["policy_version"] == 6
    accounting = summary["accounting"]
    assert accounting["balanced"], accounting
    assert accounting["samples_trained"] == 6 * 4 * 4
    assert accounting["samples_issued"] == accounting["samples_trained"] + sum(
        accounting["samples_dropped"].values()
    )
    assert summary["samples_continued"] > 0, "no weight update interrupted a request"
    steps = [r for r in records if "buffer/groups_kept" in r]
    assert max(r["buffer/staleness_max"] for r in steps) <= staleness
    assert any(r["buffer/staleness_mean"] > 0 for r in steps), "generation never ran ahead"
    assert any(r["rollout/partial_frac"] > 0 for r in steps)
    for record in steps:
        for key in (
            "pool/rollout_idle_frac",
            "pool/learner_idle_frac",
            "buffer/queue_groups",
            "buffer/in_flight_groups",
            "offpolicy/ratio_mean",
            "offpolicy/capped_frac",
            "train/logprob_mismatch",
        ):
            assert key in record, key
