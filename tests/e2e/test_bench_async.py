"""The async benchmark runs each staleness bound through `rlsys train` and writes its records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Long tier: each case is two or more `rlsys train` runs of fixed start-up cost, and the
# benchmark's own run is what its figures come from; CI runs the step and weight-sync benchmarks.
pytestmark = pytest.mark.long
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_async.py"
KEYS = {"mode", "max_staleness", "samples_per_s", "speedup_vs_sync", "eval_accuracy_after"}


def test_bench_async_writes_a_record_per_mode(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--staleness",
            "0,1",
            "--steps",
            "3",
            "--json",
            str(out),
            # small, the HF engine and the untrained model, so the test is quick
            "rollout.engine=hf",
            "warm_start.enabled=false",
            "data.batch_size=4",
            "rollout.n_samples=4",
            "eval.num_prompts=16",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "one_step_off" in result.stdout
    records = json.loads(out.read_text())
    assert [(r["mode"], r["max_staleness"]) for r in records] == [
        ("sync", 0),
        ("one_step_off", 1),
    ]
    for record in records:
        assert set(record) >= KEYS
        assert record["steps"] == 3 and record["samples_per_s"] > 0
        assert record["accounting_balanced"]
        assert record["samples_trained"] == 3 * 4 * 4  # same budget, nothing dropped
        assert 0 <= record["eval_accuracy_after"] <= 1
    assert records[0]["speedup_vs_sync"] == 1.0
    assert records[1]["staleness_mean"] > 0  # the next batch was generated during training
