"""A real run's every metric key is in docs/metrics.md; its sample tables land in
samples.jsonl and ``rlsys report`` plots its metrics. PPO with a critic, a reference in the
loss, dual clip and two rollout workers, so most key families appear."""

from __future__ import annotations

import json

import pytest

from rlsys.run.report import write_report


# long tier (about 40-75 s on 2 cores: policy, critic, reference and 2 engines start); CI checks
# the keys the code logs statically (tests/unit/test_metric_glossary.py)
@pytest.mark.long
def test_every_key_of_a_run_is_in_the_glossary(run_controller, glossary, tmp_path):
    _, steps = run_controller(
        [
            "algorithm=ppo",
            "algorithm.kl_penalty=loss",
            "algorithm.kl_estimator=k3",
            "algorithm.dual_clip=3.0",
            "trainer.total_steps=2",
            "trainer.eval_every=1",
            "eval.num_prompts=16",
            "data.batch_size=4",
            "rollout.n_samples=4",
            "rollout.num_workers=2",
            "rollout.num_cpus_per_worker=1",
            "learner.world_size=1",
            "task.reward=digit_fraction",
            "tracking.sample_table_every=1",
            "tracking.sample_table_rows=3",
        ]
    )
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    keys = {k for r in records for k in r} - {"step", "time"}
    for key in ("critic/loss", "train/kl_ref", "train/dual_clipped", "time/rollout_worker_1"):
        assert key in keys, key
    # the rooflines (docs/roofline.md): a step trained, generated and has a floor
    for key in ("perf/mfu", "perf/decode_bw_frac", "perf/floor_s", "perf/floor_reference_s"):
        assert key in keys, key
    trained = [r for r in records if "perf/mfu" in r]
    assert all(r["perf/mfu"] > 0 and r["perf/step_over_floor"] > 1 for r in trained), trained
    missing = sorted(k for k in keys if not glossary.covers(k))
    assert not missing, f"add these keys to docs/metrics.md: {missing}"

    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 1, 2, 2, 2]
    assert all(s["prompt"].endswith("=") and isinstance(s["response"], str) for s in samples)
    assert len({s["prompt"] for s in samples[:3]}) == 3  # one sample per prompt

    index = write_report(tmp_path)
    assert {"stage_times", "rollout_workers", "family_critic"} <= {
        p.stem for p in index.parent.glob("*.png")
    }
