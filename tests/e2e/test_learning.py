"""The default demo learns: `rlsys train` with no arguments clears the accuracy bar."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_default_demo_reaches_the_accuracy_bar(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "rlsys.cli", "train", f"run.output_dir={tmp_path}", "run.name=demo"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((tmp_path / "demo" / "summary.json").read_text())
    print(
        json.dumps(
            {
                k: summary[k]
                for k in ("eval_accuracy_before", "eval_accuracy_after", "wall_s", "total_wall_s")
            }
        )
    )
    assert summary["eval_num_prompts"] >= 200
    assert summary["eval_accuracy_after"] >= 0.80
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.30


@pytest.mark.slow
def test_ppo_with_a_critic_raises_accuracy(tmp_path):
    """PPO (critic, GAE, KL reward penalty) from the same cached warm start as the demo."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlsys.cli",
            "train",
            "algorithm=ppo",
            "trainer.total_steps=60",
            "trainer.eval_every=0",
            "eval.num_prompts=200",
            f"run.output_dir={tmp_path}",
            "run.name=ppo",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((tmp_path / "ppo" / "summary.json").read_text())
    print(json.dumps({k: summary[k] for k in ("eval_accuracy_before", "eval_accuracy_after")}))
    assert summary["eval_accuracy_after"] - summary["eval_accuracy_before"] >= 0.15
