"""rlsys doctor's runner and report, with small checks defined here: a check that raises is a
recorded failure with its message and exit code 1, a skip is not a failure, bad flags exit 2."""

from __future__ import annotations

import json
import subprocess

from rlsys import cli
from rlsys.run.doctor import (
    FAILED,
    NO_CUDA,
    PASSED,
    SKIPPED,
    Check,
    CheckFailed,
    Context,
    Skip,
    exit_code,
    run_doctor,
    write_report,
)
from rlsys.run.doctor_checks import _junit_counts


def measures(ctx: Context) -> dict:
    return {"seconds": 0.5}


def breaks(ctx: Context) -> dict:
    raise ValueError("model.path=/nope: no such directory; set model.path")


def cannot_run(ctx: Context) -> dict:
    raise Skip("needs a thing this machine lacks")


def hangs(ctx: Context) -> dict:
    raise subprocess.TimeoutExpired(["rlsys", "train"], ctx.timeout_s)


def fails_with_figures(ctx: Context) -> dict:
    raise CheckFailed("2 of 3 failed", {"passed": 1, "failed": 2})


def no_device(ctx: Context) -> dict:
    raise Skip(NO_CUDA)


def _run(tmp_path, checks, gpu=False, only=None):
    ctx = Context(tmp_path, timeout_s=7)
    results = run_doctor(checks, ctx, gpu, only)
    write_report(results, ctx, ["--test"])
    return results, json.loads((tmp_path / "doctor.json").read_text())


def test_a_raising_check_is_a_failure_with_its_message_and_exit_code_1(tmp_path, capsys):
    checks = [Check("ok", "cpu", measures, "a"), Check("broken", "cpu", breaks, "b")]
    results, report = _run(tmp_path, checks)
    assert [r.status for r in results] == [PASSED, FAILED]
    assert results[1].reason == "ValueError: model.path=/nope: no such directory; set model.path"
    assert exit_code(results) == 1 and report["exit_code"] == 1
    assert report["checks"][0]["details"] == {"seconds": 0.5}
    md = (tmp_path / "doctor.md").read_text()
    assert "| broken | cpu | failed |" in md and "model.path=/nope" in md
    assert "broken" in capsys.readouterr().out  # printed as it ran


def test_skips_timeouts_and_kept_figures(tmp_path):
    checks = [
        Check("skip", "cpu", cannot_run, "a"),
        Check("slow", "cpu", hangs, "b"),
        Check("partial", "cpu", fails_with_figures, "c"),
    ]
    results, report = _run(tmp_path, checks)
    assert [r.status for r in results] == [SKIPPED, FAILED, FAILED]
    assert results[0].reason == "needs a thing this machine lacks"
    assert results[1].reason == "timed out after 7 s; raise --timeout"
    assert results[2].details == {"passed": 1, "failed": 2}
    assert exit_code(results[:1]) == 0  # a skip alone is not a failure
    assert report["counts"] == {"passed": 0, "failed": 2, "skipped": 1}


def test_gpu_half_is_skipped_without_gpu_or_without_a_device(tmp_path):
    checks = [Check("probe", "gpu", no_device, "p"), Check("after", "gpu", breaks, "a")]
    results, _ = _run(tmp_path, checks, gpu=False)
    assert [r.reason for r in results] == ["the GPU half runs with --gpu"] * 2
    results, _ = _run(tmp_path, checks, gpu=True)
    assert [(r.status, r.reason) for r in results] == [(SKIPPED, NO_CUDA)] * 2
    results, _ = _run(tmp_path, [Check("ok", "cpu", measures, "a")], only=set())
    assert results[0].reason == "not named in --checks"


def test_bad_flags_exit_2_naming_them(tmp_path, capsys):
    assert cli.main(["doctor", "--out", str(tmp_path), "--checks", "versions,nope"]) == 2
    assert "--checks: unknown ['nope']" in capsys.readouterr().err
    assert cli.main(["doctor", "--out", str(tmp_path), "--timeout", "0"]) == 2
    assert "--timeout 0: must be a positive" in capsys.readouterr().err
    assert not (tmp_path / "doctor.json").exists()


def test_junit_counts(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="a" name="ok"><properties/></testcase>'
        '<testcase classname="a" name="bad"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="a" name="err"><error message="fixture broke"/></testcase>'
        '<testcase classname="a" name="gpu"><skipped message="needs CUDA"/></testcase>'
        "</testsuite></testsuites>"
    )
    counts = _junit_counts(xml)
    assert {k: counts[k] for k in ("passed", "failed", "errors", "skipped")} == {
        "passed": 1,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
    }
    assert counts["failures"] == ["a::bad: assert 1 == 2", "a::err: fixture broke"]
    assert counts["skip_reasons"] == ["needs CUDA"]
