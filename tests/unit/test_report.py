"""``rlsys report``: panels and index.html from a synthetic metrics.jsonl (nulls, a rewind,
eval steps, an unknown key family), and errors that name the file, the line and the fix."""

from __future__ import annotations

import json

import pytest

from rlsys.cli import main
from rlsys.run.report import ReportError, load_metrics, panels, series, write_report


def _record(step: int, **extra) -> dict:
    return {
        "step": step,
        "time": 1000.0 + step,
        "rollout/reward_mean": 0.1 * step,
        "rollout/accuracy": 0.1 * step,
        "train/kl": None if step == 2 else 0.01,  # a non-finite value is logged as null
        "train/entropy": 0.5,
        "rollout/response_tokens": 4.0,
        "time/generation": 0.2,
        "time/wait_for_batch": 0.25,
        "time/train": 0.5,
        "time/rollout_worker_0": 0.2,
        "perf/step_s": 0.8,
        "perf/tokens_per_s": 1000.0,
        "perf/samples_per_s": 250.0,
        "pool/rollout_idle_frac": 0.6,
        "buffer/staleness_mean": 0.0,
        "rm/margin": 0.3,
        **extra,
    }


def _write(run, records: list[dict | str]) -> None:
    run.mkdir(exist_ok=True)
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_rewind_drops_the_steps_logged_again_and_a_repeated_step_merges(tmp_path):
    _write(
        tmp_path,
        [
            {"step": 0, "eval/accuracy": 0.5},
            _record(1),
            _record(2),
            _record(3, **{"rollout/reward_mean": 9.0}),  # then the run fell back to step 1
            _record(2, **{"train/kl": 0.02}),
            _record(3),
            {"step": 3, "eval/accuracy": 0.7},  # the final eval, a record of its own
        ],
    )
    steps = load_metrics(tmp_path / "metrics.jsonl")
    assert list(steps) == [0, 1, 2, 3]
    assert steps[2]["train/kl"] == 0.02 and steps[3]["rollout/reward_mean"] == pytest.approx(0.3)
    data = series(steps)
    assert data["eval/accuracy"] == ([0, 3], [0.5, 0.7])
    assert "time" not in data and "step" not in data


def test_report_writes_a_png_per_panel_and_an_index(tmp_path, capsys):
    run = tmp_path / "run"
    records = [{"step": 0, "eval/accuracy": 0.5}]
    records += [_record(s, **({"eval/accuracy": 0.6} if s == 3 else {})) for s in range(1, 5)]
    _write(run, records)
    (run / "summary.json").write_text(
        json.dumps({"steps": 4, "eval_accuracy_after": 0.6, "accounting": {"balanced": True}})
    )
    samples = [{"step": 2, "prompt": "1+1=", "response": "200", "reward": 1.0, "correct": True}]
    samples.append({**samples[0], "step": 4, "prompt": "<b>2+2=</b>"})
    (run / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples) + "{cut")
    assert main(["report", str(run)]) == 0
    index = run / "report" / "index.html"
    assert capsys.readouterr().out.strip() == f"report: {index.resolve()}"
    pngs = {p.stem for p in (run / "report").glob("*.png")}
    assert pngs == {
        "reward",
        "accuracy",
        "kl",
        "entropy",
        "response_length",
        "stage_times",
        "rollout_workers",
        "throughput",
        "idle_staleness",
        "family_rm",  # a key family with no panel of its own
    }
    assert all((run / "report" / f"{p}.png").read_bytes()[:4] == b"\x89PNG" for p in pngs)
    page = index.read_text()
    assert all(f"<img src='{p}.png'" in page for p in pngs)
    assert "<th>accounting.balanced</th><td>True</td>" in page
    assert "<th>eval_accuracy_after</th><td>0.6</td>" in page
    assert "<h2>Samples at step 4</h2>" in page and "<td>&lt;b&gt;2+2=&lt;/b&gt;</td>" in page


def test_panels_without_their_keys_are_skipped():
    chosen = panels(["sft/loss", "eval/accuracy", "dpo/reward_margin", "dpo/loss"])
    assert [(p.name, p.keys) for p in chosen] == [
        ("accuracy", ["eval/accuracy"]),
        ("loss", ["sft/loss"]),
        ("family_dpo", ["dpo/reward_margin", "dpo/loss"]),
    ]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "has no metrics.jsonl"),
        ("", "is empty"),
        ("\n\n", "is empty"),
        ('{"step": 1, "a/b": 1}\n{"step": 2, "a/b"\n', "line 2 is not valid JSON"),
        ('{"step": 1, "a/b": 1}\n[1, 2]\n', 'line 2 has no integer "step"'),
        ('{"step": 1, "time": 5.0}\n', "no numeric metric"),
    ],
)
def test_bad_inputs_name_the_file_and_the_fix(tmp_path, content, needle):
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(ReportError, match=needle) as err:
        write_report(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_a_missing_run_dir_or_the_parent_of_runs_is_explained(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "does not exist; pass a run directory" in capsys.readouterr().err
    _write(tmp_path / "r1", [_record(1)])
    assert main(["report", str(tmp_path)]) == 2
    assert "it holds the runs r1: pass one of those" in capsys.readouterr().err
    (tmp_path / "r1" / "summary.json").write_text("{")
    assert main(["report", str(tmp_path / "r1")]) == 2
    assert "summary.json is not valid JSON" in capsys.readouterr().err
