"""The ``rlsys`` command as a user runs it: fast config errors, topologies, outputs, bench."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlsys.config.schema import TaskConfig
from rlsys.data.tasks import load_task
from rlsys.run.doctor_checks import TRAIN_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
SHORT = TRAIN_OVERRIDES  # the short job `rlsys doctor` runs too


def _rlsys(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlsys.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _run_ok(command: str, tmp_path: Path, name: str, *overrides: str):
    """Run ``rlsys <command>`` into ``tmp_path/name``; return its run dir, summary and result."""
    result = _rlsys(command, *overrides, f"run.output_dir={tmp_path}", f"run.name={name}")
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / name
    return run, json.loads((run / "summary.json").read_text()), result


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("learner.world_sizee=2", "learner.world_size"),
        ("data.batch_size=-1", "data.batch_size"),
        ("learner.world_size=64", "learner.world_size=64"),
        ("task.reward=nope", "task.reward='nope'"),
        ("eval.validation_prompts=100", "eval.validation_prompts=100 needs 600 held-out"),
    ],
)
def test_bad_override_fails_fast_naming_the_key(override, needle):
    started = time.perf_counter()
    result = _rlsys("train", override, timeout=30)
    assert result.returncode != 0
    assert time.perf_counter() - started < 5
    assert needle in result.stderr and "config error" in result.stderr


def test_cfg_job_prints_the_resolved_config():
    result = _rlsys("train", "--cfg", "job", "learner.world_size=1", timeout=30)
    assert result.returncode == 0
    assert "world_size: 1" in result.stdout and "max_staleness: 0" in result.stdout


@pytest.mark.parametrize(
    "topology",
    [
        # one rank is the simpler topology: CI runs the other (the long tier runs both)
        pytest.param(["learner.world_size=1"], marks=pytest.mark.long, id="ws1"),
        pytest.param(
            [
                "learner.world_size=2",
                "rollout.num_workers=2",
                "rollout.num_cpus_per_worker=1",
                "eval.validation_prompts=16",  # the best policy, exported from two ranks
            ],
            id="ws2-rw2",
        ),
    ],
)
def test_train_runs_on_each_topology_and_leaves_its_outputs(tmp_path, topology):
    run, summary, result = _run_ok("train", tmp_path, "r", *SHORT, *topology)
    last = result.stdout.strip().splitlines()[-1]
    assert last == f"summary: {run / 'summary.json'}"
    for key in (
        "steps",
        "wall_s",
        "samples",
        "samples_per_s",
        "tokens_per_s",
        "eval_accuracy_before",
        "eval_accuracy_after",
        "run_dir",
    ):
        assert key in summary, key
    assert summary["steps"] == 2 and summary["samples"] == 2 * 8 * 4
    assert "world_size: " + topology[0].split("=")[1] in (run / "config.yaml").read_text()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # eval at step 0, then two steps
    assert (run / "checkpoints" / "final" / "config.json").exists()
    if "eval.validation_prompts=16" in topology:
        _check_best_policy(run, summary, [json.loads(line) for line in lines])
    final = f"model.path={run / 'checkpoints' / 'final'}"
    evaluated = _rlsys("eval", final, "eval.num_prompts=16", "eval.group_by=level", timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    result = json.loads(evaluated.stdout)
    assert result["num_prompts"] == 16
    levels = {p.meta["level"] for p in load_task(TaskConfig(), 0).eval[:16]}
    assert set(result["accuracy_by"]) == {str(level) for level in levels}


def _check_best_policy(run: Path, summary: dict, metrics: list[dict]) -> None:
    """checkpoints/best holds the policy of the first evaluation with the highest
    validation accuracy, and its record names that evaluation's step and figures."""
    evals = [m for m in metrics if "eval/validation_accuracy" in m]
    assert [m["step"] for m in evals] == [0, 2]
    top = max(m["eval/validation_accuracy"] for m in evals)
    first = next(m for m in evals if m["eval/validation_accuracy"] == top)
    chosen = {
        "step": first["step"],
        "validation_accuracy": top,
        "accuracy": first["eval/accuracy"],
    }
    assert summary["selected"] == chosen
    best = run / "checkpoints" / "best"
    assert summary["best_model"] == str(best)
    record = json.loads((best / "selection.json").read_text())
    assert len(record.pop("validation_set")) == 16 and record == chosen
    assert (best / "config.json").exists() and (best / "model.safetensors").exists()


@pytest.mark.long  # CI runs the weight-sync benchmark; this one's stages are timed in CI's runs
def test_bench_step_prints_its_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "scripts/bench_step.py",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--json",
            str(out),
            "data.batch_size=8",
            "rollout.n_samples=4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "overhead" in result.stdout and "weight_sync" in result.stdout
    records = json.loads(out.read_text())
    stages = {r["stage"]: r for r in records}
    assert {
        "generation",
        "scoring",
        "learner_logprobs",
        "train",
        "weight_sync",
        "overhead",
        "step",
    } <= stages.keys()
    parts = sum(r["seconds_mean"] for s, r in stages.items() if s != "step")
    assert parts == pytest.approx(stages["step"]["seconds_mean"], rel=1e-6)
    # the peak measured again after the steps, and the floor at the higher of the two peaks
    step = stages["step"]
    assert step["peak_tflops_after"] > 0 and step["peak_tflops"] > 0
    higher = max(step["peak_tflops"], step["peak_tflops_after"])
    assert step["mfu_at_higher_peak"] == pytest.approx(step["mfu"] * step["peak_tflops"] / higher)
    assert 0 < step["floor_s_at_higher_peak"] <= step["floor_s"]
    assert "matmul peak measured again after the steps" in result.stdout


def test_sft_command_trains_and_exports_a_model(tmp_path):
    run, summary, _ = _run_ok(
        "sft",
        tmp_path,
        "s",
        "sft.max_steps=4",
        "sft.eval_every=2",
        "sft.eval_prompts=16",
        "sft.target_accuracy=null",
        "learner.world_size=1",
    )
    assert summary["steps"] == 4
    assert (run / "checkpoints" / "final" / "model.safetensors").exists()
    evals = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [2, 4] and "sft/loss" in evals[0]


@pytest.mark.long  # CI's runs take the cached warm start (SFT itself: the sft command test)
def test_uncached_warm_start_trains_fresh_and_keeps_its_model_in_the_run(tmp_path):
    overrides = [o for o in SHORT if not o.startswith("warm_start")]
    run, summary, _ = _run_ok(
        "train",
        tmp_path,
        "w",
        *overrides,
        "warm_start.cache=false",
        "sft.max_steps=2",
        "sft.eval_every=1",
        "sft.eval_prompts=8",
        "sft.target_accuracy=null",
        "learner.world_size=1",
    )
    warm = summary["warm_start"]
    assert warm["cached"] is False and warm["steps"] == 2
    assert warm["path"] == str(run / "checkpoints" / "warm_start")
    assert (run / "checkpoints" / "warm_start" / "config.json").exists()
    assert summary["model_path"] == warm["path"]
