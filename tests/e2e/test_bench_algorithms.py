"""The algorithm benchmark runs presets through `rlsys train` and writes the docs' records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Long tier: each case is two or more `rlsys train` runs of fixed start-up cost, and the
# benchmark's own run is what its figures come from; CI runs the step and weight-sync benchmarks.
pytestmark = pytest.mark.long
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_algorithms.py"
KEYS = {"algorithm", "steps", "wall_s", "eval_accuracy_before", "eval_accuracy_after"}


def test_bench_algorithms_writes_a_record_per_preset(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--algorithms",
            "dapo",  # one preset: the records and the sample budget are the same code for all
            "--steps",
            "2",
            "--json",
            str(out),
            # small and from the untrained model, so the test is quick
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
    assert "algorithm" in result.stdout and "dapo" in result.stdout
    records = json.loads(out.read_text())
    assert [r["algorithm"] for r in records] == ["dapo"]
    for record in records:
        assert set(record) >= KEYS
        # DAPO on the untrained model may filter every group: the budget then runs out
        # before a batch with signal is complete, and no step trains
        assert 0 <= record["steps"] <= 2 and record["wall_s"] > 0
        assert record["samples"] <= 2 * 4 * 4  # the budget of 2 x 4 x 4 samples holds
        assert 0 <= record["eval_accuracy_after"] <= 1


def test_bench_algorithms_rejects_unknown_presets():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--algorithms", "ppo,trpo"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "trpo" in result.stderr
