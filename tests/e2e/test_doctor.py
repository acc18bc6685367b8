"""``rlsys doctor --gpu`` on this CPU machine: the CPU half really runs (versions, a 2-step
training run) and the GPU half says it skipped for want of a CUDA device; with only the device
probe mocked to report a GPU, the GPU half runs its real steps, and their real failures here
are what the report records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlsys import cli
from rlsys.run import doctor_checks
from rlsys.run.doctor import NO_CUDA

ROOT = Path(__file__).resolve().parents[2]
GPU_CHECKS = ["gpu_devices", "gpu_tests", "gpu_train", "gpu_weight_sync"]
pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the CPU machine's outcomes; a GPU box runs them"
)


def _statuses(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.parametrize(
    "cpu_checks",
    [
        ["versions"],
        # the 2-step training run costs a minute; CI runs `rlsys train` in other tests
        pytest.param(["versions", "cpu_train"], marks=pytest.mark.long),
    ],
    ids=["versions", "with-train"],
)
def test_doctor_gpu_on_cpu_runs_the_cpu_half_and_skips_the_gpu_half(tmp_path, cpu_checks):
    only = ",".join([*cpu_checks, *GPU_CHECKS])
    result = subprocess.run(
        [sys.executable, "-m", "rlsys.cli", "doctor", "--gpu", "--out", str(tmp_path)]
        + ["--checks", only, "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    checks = _statuses(json.loads((tmp_path / "doctor.json").read_text()))
    assert checks["versions"]["status"] == "passed"
    assert checks["versions"]["details"]["torch"] == torch.__version__
    for name in GPU_CHECKS:
        assert (checks[name]["status"], checks[name]["reason"]) == ("skipped", NO_CUDA)
    assert checks["cpu_weight_sync"]["reason"] == "not named in --checks"
    assert "cpu_weight_sync, gpu_devices, gpu_tests, gpu_train, gpu_weight_sync" in result.stdout
    assert "| versions | cpu | passed |" in (tmp_path / "doctor.md").read_text()
    if "cpu_train" not in cpu_checks:
        assert checks["cpu_train"]["reason"] == "not named in --checks"
        return
    train = checks["cpu_train"]
    assert train["status"] == "passed", train["reason"]
    assert train["details"]["steps"] == 2 and train["details"]["accounting_balanced"]
    assert train["details"]["weight_sync_s_mean"] > 0
    assert (tmp_path / "runs" / "cpu-train" / "summary.json").exists()
    assert "| cpu_train | cpu | passed |" in (tmp_path / "doctor.md").read_text()


def test_gpu_half_runs_its_steps_when_the_probe_reports_a_gpu(tmp_path, monkeypatch, capsys):
    mocked = [{"index": 0, "name": "mocked by the test", "memory_gib": 0.0, "capability": "?"}]
    monkeypatch.setattr(doctor_checks, "probe_devices", lambda: mocked)
    argv = ["doctor", "--gpu", "--out", str(tmp_path), "--checks", ",".join(GPU_CHECKS)]
    assert cli.main([*argv, "--timeout", "240"]) == 1  # the steps fail: no CUDA here
    checks = _statuses(json.loads((tmp_path / "doctor.json").read_text()))
    assert checks["gpu_devices"]["details"]["devices"] == mocked
    # each step ran for real and failed for the real reason, in its own words
    tests = checks["gpu_tests"]
    assert tests["status"] == "failed" and tests["details"]["skipped"] >= 1
    assert tests["details"]["passed"] == 0 and "no gpu-marked test ran" in tests["reason"]
    assert (tmp_path / "gpu_tests.xml").exists()
    train = checks["gpu_train"]
    assert train["status"] == "failed" and "need 1 whole GPUs but Ray has 0" in train["reason"]
    sync = checks["gpu_weight_sync"]
    assert sync["status"] == "failed" and "--device cuda: no CUDA device" in sync["reason"]
    md = (tmp_path / "doctor.md").read_text()
    for name in ("gpu_tests", "gpu_train", "gpu_weight_sync"):
        assert f"| {name} | gpu | failed |" in md and f"## {name}: failed" in md
    assert "need 1 whole GPUs but Ray has 0" in md and "no CUDA device is visible" in md
    assert "failed: gpu_tests, gpu_train, gpu_weight_sync" in capsys.readouterr().out
