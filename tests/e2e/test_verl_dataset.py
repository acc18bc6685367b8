"""Datasets as users have them train as they are (issue 49): a verl-format parquet file and a
Hugging Face ``datasets`` directory, each ``rlsys train task.name=file task.train_path=<it>``
with no conversion step, 2 steps through real actors; the verl file's ``data_source`` picks the
reward (``reward.by_source``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rlsys.run.doctor_checks import TRAIN_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]


def verl_rows() -> list[dict]:
    return [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": "train", "index": 10 * a + b},
        }
        for a in range(10)
        for b in range(10)
    ]


def _train_two_steps(tmp_path, path, *overrides: str) -> list[dict]:
    """The run's step metrics."""
    result = subprocess.run(
        [sys.executable, "-m", "rlsys.cli", "train", "task.name=file"]
        + [f"task.train_path={path}", "task.eval_size=16"]
        + ["task.max_new_tokens=8"]
        + TRAIN_OVERRIDES
        + ["learner.world_size=1", f"run.output_dir={tmp_path}", "run.name=r", *overrides],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 2
    lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "rollout/reward_mean" in row]


@pytest.mark.timeout(600)
def test_two_steps_on_a_verl_parquet_file(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame(verl_rows()).to_parquet(path)
    # its rows' data_source routes them to the format reward, here 1 for any reply: the
    # untrained model's replies, which exact_match (task.reward) scores about 0, all score 1
    steps = _train_two_steps(
        tmp_path,
        path,
        "+reward.by_source.arithmetic=format",
        "reward.format_pattern='(?s).*'",
    )
    assert [step["rollout/reward_mean"] for step in steps] == [1.0, 1.0]


# long tier: a directory takes the same path into training as the parquet file above once
# read, and its reading is tests/unit/test_dataset_layouts.py's (26 s of CI saved)
@pytest.mark.long
@pytest.mark.timeout(600)
def test_two_steps_on_a_datasets_directory(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [
        {"prompt": r["prompt"][0]["content"], "answer": r["reward_model"]["ground_truth"]}
        for r in verl_rows()
    ]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "data")
    )
    _train_two_steps(tmp_path, tmp_path / "data")
