"""Math rewards (boxed, math_verify, format, gsm8k), the GSM8K/MATH converters, the
preprocessing script and the gsm8k/math task presets."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlsys.config import ConfigError
from rlsys.config.reward import RewardConfig
from rlsys.config.schema import TaskConfig
from rlsys.data.math_data import convert_rows, detect_format, read_rows, split_rows
from rlsys.data.tasks import load_task
from rlsys.resolve import load_config
from rlsys.rewards import REWARDS, score
from rlsys.rewards.math import last_boxed, normalise_answer, same_answer
from rlsys.rewards.registry import build_reward

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SCRIPT = REPO / "scripts" / "preprocess_math.py"


def test_last_boxed_balances_braces_and_takes_the_last_complete_box():
    assert last_boxed(r"so \boxed{\frac{1}{\sqrt{2}}}.") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed(r"\boxed{1} then \fbox{ {a}{b} } done") == " {a}{b} "
    assert last_boxed(r"\boxed{\boxed{7}}") == r"\boxed{7}"  # nested: the outer box's content
    assert last_boxed(r"\boxed{3} and cut off \boxed{\frac{1}{2") == "3"
    assert last_boxed(r"the answer is \boxed 5$.") == "5"
    assert last_boxed("no box here") is None


def test_normalisation_and_numeric_equality():
    assert normalise_answer(r"$\left( 1, 2 \right)$.") == "(1,2)"
    assert normalise_answer(r"\dfrac{1}{2}") == normalise_answer(r"\tfrac{1}{2}") == r"\frac{1}{2}"
    assert normalise_answer(r"1,234,567\!") == "1234567"
    assert same_answer("0.50", "0.5") and same_answer("12.0", "12") and same_answer("-3", "-3.0")
    assert not same_answer("(1,2)", "(1,3)") and not same_answer("0.5", r"\frac{1}{2}")


def test_boxed_reward():
    boxed = REWARDS.get("boxed")
    assert boxed("q", r"We get \boxed{\dfrac{3}{4}}.", {"answer": r"\frac{3}{4}"}) == 1.0
    assert boxed("q", r"first \boxed{2}, finally \boxed{1,000}", {"answer": "1000"}) == 1.0
    assert boxed("q", r"\boxed{12.0}", {"answer": "12"}) == 1.0
    assert boxed("q", r"\boxed{13}", {"answer": "12"}) == 0.0
    assert boxed("q", "12", {"answer": "12"}) == 0.0  # no box


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        (r"The result is \boxed{\frac{1}{2}}.", "0.5"),
        (r"The result is $0.5$.", r"\frac{1}{2}"),
        (r"Therefore \boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}"),
        ("Adding up, the total is 1,475 dollars.", "1475"),
        (r"\boxed{\dfrac{4}{9}}", r"\frac{4}{9}"),
    ],
)
def test_math_verify_accepts_equivalent_answers(completion, answer):
    out = REWARDS.get("math_verify")("q", completion, {"answer": answer})
    assert out == {"reward": 1.0, "correct": True}


@pytest.mark.parametrize(
    ("completion", "answer"),
    [(r"\boxed{\frac{1}{3}}", "0.5"), (r"\boxed{\sqrt{3}}", r"\sqrt{2}"), ("no idea", "7")],
)
def test_math_verify_rejects_wrong_or_missing_answers(completion, answer):
    out = REWARDS.get("math_verify")("q", completion, {"answer": answer})
    assert out == {"reward": 0.0, "correct": False}


def test_math_verify_runs_off_the_main_thread():
    """Its default signal.alarm timeouts would raise off the main thread; ours are off."""
    fn, results = REWARDS.get("math_verify"), []

    def work():
        try:
            results.append(fn("q", r"so \boxed{\frac{2}{4}}", {"answer": "0.5"}))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            results.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert results == [{"reward": 1.0, "correct": True}]
    out = score(fn, "q", r"\boxed{\sqrt{2}/2}", {"answer": r"\frac{\sqrt{2}}{2}"}, timeout_s=60)
    assert out.reward == 1.0 and out.correct and out.error is None


def test_math_verify_unparseable_answer_is_a_counted_error():
    out = score(REWARDS.get("math_verify"), "q", r"\boxed{1}", {"answer": ""}, timeout_s=60)
    assert out.reward == 0.0 and "task.answer_key" in out.error


def test_format_reward_fullmatches_the_configured_pattern():
    fmt = build_reward("format", RewardConfig(format_pattern=r".*\\boxed\{.+\}\s*"))
    assert fmt("q", "Reason...\nso\n\\boxed{4}\n", {}) == 1.0
    assert fmt("q", "\\boxed{4} but then more words", {}) == 0.0  # must end with the box
    assert fmt("q", "no box", {}) == 0.0
    with pytest.raises(ConfigError, match=r"reward\.format_pattern"):
        build_reward("format", RewardConfig(format_pattern=r"\boxed{("))


def test_gsm8k_reward():
    gsm8k = REWARDS.get("gsm8k")
    assert gsm8k("q", "5 * 295 = 1475\n#### 1,475", {"answer": "1475"}) == 1.0
    assert gsm8k("q", "#### 42\nThat took 3 steps.", {"answer": "42"}) == 1.0
    assert gsm8k("q", "It was 4 - 9 = -5 degrees.", {"answer": "-5"}) == 1.0
    assert gsm8k("q", "#### 41, not 42", {"answer": "42"}) == 0.0
    assert gsm8k("q", "no numbers", {"answer": "1"}) == 0.0


def test_gsm8k_converter_on_the_fixture():
    result = convert_rows(read_rows(FIXTURES / "gsm8k_mini.jsonl"))
    assert (result.format, len(result.rows), result.skipped) == ("gsm8k", 7, 1)
    by_answer = {row["answer"]: row for row in result.rows}
    assert set(by_answer) == {"29", "8", "1475", "-5", "210", "78", "3.5"}
    row = by_answer["1475"]
    assert row["prompt"].startswith("A bike costs") and "####" not in row["solution"]
    assert row["solution"].endswith("1475 dollars.")


def test_math_converter_on_the_fixture():
    result = convert_rows(read_rows(FIXTURES / "math_mini.jsonl"), "math")
    assert (result.format, len(result.rows), result.skipped) == ("math", 5, 1)
    answers = [row["answer"] for row in result.rows]
    assert answers == [r"\frac{1}{2}", r"\sqrt{2}", "6", r"\frac{4}{9}", r"\{-3, 3\}"]
    assert result.rows[0]["level"] == "Level 1" and result.rows[0]["type"] == "Prealgebra"
    assert result.rows[3]["subject"] == "Algebra" and result.rows[3]["level"] == 2
    # Each reference solution earns full reward against its own converted answer.
    for row in result.rows:
        assert REWARDS.get("boxed")(row["prompt"], row["solution"], row) == 1.0
        assert REWARDS.get("math_verify")(row["prompt"], row["solution"], row)["correct"]


def test_format_detection_names_the_keys_and_formats(tmp_path):
    with pytest.raises(ValueError, match=r"\['input', 'target'\].*gsm8k.*math"):
        detect_format([{"input": "x", "target": "y"}])
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"problem": "p", "solution": r"\boxed{1}"}, 3]))
    result = convert_rows(read_rows(path))
    assert (result.format, len(result.rows), result.skipped) == ("math", 1, 1)


def test_split_rows_is_seeded_and_holds_out_a_share():
    rows = [{"i": i} for i in range(10)]
    train, held = split_rows(rows, 0.2, seed=0)
    assert len(train) == 8 and len(held) == 2 and split_rows(rows, 0.2, seed=0)[1] == held
    assert sorted(r["i"] for r in train + held) == list(range(10))
    assert split_rows(rows, 0.0, seed=0) == (rows, [])


def _preprocess(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_preprocess_script_end_to_end_feeds_a_file_task(tmp_path, suffix):
    out, held = tmp_path / f"train{suffix}", tmp_path / "eval.jsonl"
    run = _preprocess(
        "--input", str(FIXTURES / "gsm8k_mini.jsonl"), "--output", str(out),
        "--eval-fraction", "0.3", "--seed", "1", "--eval-output", str(held),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "format: gsm8k; converted: 7; skipped: 1" in run.stdout
    assert f"wrote 5 rows to {out}" in run.stdout and f"wrote 2 rows to {held}" in run.stdout
    splits = load_task(TaskConfig(name="file", train_path=str(out), eval_path=str(held)), 0)
    assert len(splits.train) == 5 and len(splits.eval) == 2 and splits.skipped_rows == 0
    every = splits.train + splits.eval
    assert {p.answer for p in every} == {"29", "8", "1475", "-5", "210", "78", "3.5"}
    assert all(p.text and "####" not in p.meta["solution"] for p in every)


def test_converted_math_file_feeds_a_file_task_with_held_out_eval(tmp_path):
    out = tmp_path / "math.parquet"
    run = _preprocess("--input", str(FIXTURES / "math_mini.jsonl"), "--output", str(out))
    assert run.returncode == 0, run.stderr
    assert "format: math; converted: 5; skipped: 1" in run.stdout
    splits = load_task(TaskConfig(name="file", train_path=str(out)), 0)
    assert len(splits.train) == 4 and len(splits.eval) == 1  # eval held out of train
    assert all(p.answer and p.text for p in splits.train + splits.eval)


def test_preprocess_script_errors_name_the_input(tmp_path):
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"input": "x", "target": "y"}\n')
    run = _preprocess("--input", str(bad), "--output", str(tmp_path / "o.jsonl"))
    assert run.returncode == 1 and "['input', 'target']" in run.stderr
    run = _preprocess("--input", str(bad), "--output", "o.jsonl", "--eval-fraction", "0.1")
    assert run.returncode == 2 and "--eval-output" in run.stderr


@pytest.mark.parametrize(("preset", "reward"), [("gsm8k", "gsm8k"), ("math", "math_verify")])
def test_math_task_presets(preset, reward):
    task = load_config([f"task={preset}"]).task
    assert (task.name, task.reward, task.chat_template) == ("file", reward, True)
    assert REWARDS.get(task.reward) and task.instruction and task.train_path
