"""The one-GPU check's CPU half (``scripts/gpu_check.py --cpu``), as CI can run it: the same
code as on a GPU, with Ray's logical GPU for the placement, the object store for the sync and a
small model in place of Qwen2.5-0.5B's shape. Its GPU figures come from a GPU machine only
(docs/status.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def test_the_cpu_half_runs_every_check_it_can(tmp_path):
    report_path = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--cpu"]
        + ["--out", str(tmp_path / "out"), "--json", str(report_path)],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status == {
        "ray": "passed",
        "placement": "passed",
        "sync": "passed",
        "qwen_shape": "passed",
        "deepspeed": "skipped",  # has CPU tests of its own
        "grpo": "passed",
        "compiled": "skipped",  # likewise
    }
    figures = {c["name"]: c["figures"] for c in report["checks"]}
    assert figures["placement"]["gpu"] == "0"  # learner and engine on the one logical GPU
    assert figures["sync"]["changed_by_step"] > 0 and figures["sync"]["tensors"] > 0
    handover = figures["qwen_shape"]["handover"]
    assert handover["engine_freed_gib"] >= 0 and "learner_released_gib" in handover
    assert figures["grpo"]["steps"] == 2
    assert "memory/engine_freed_bytes" in figures["grpo"]["memory_gib"]
    lines = [x for x in result.stdout.splitlines() if x.startswith("gpu_check: ")]
    assert len(lines) == 8  # one line per check, then the total
