"""``rlsys doctor [--gpu]``: check this machine's stack with short real runs and write a report.

Each check is a small function (``rlsys/run/doctor_checks.py``) that returns the figures it
measured, raises ``Skip`` when it cannot run here, or raises anything else to fail. This module
runs them in order, prints a line as each starts and ends, and writes ``doctor.json`` and
``doctor.md`` to the output directory: the files a user attaches to a bug report. The exit code
is 1 when a check failed (a skip is not a failure), 2 for a bad flag, else 0.
"""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False on this machine)"


class Skip(Exception):
    """The check cannot run here; the message says why."""


class CheckFailed(Exception):
    """A check ran and its outcome is a failure; ``details`` keeps what it measured."""

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class DoctorError(Exception):
    """A bad ``rlsys doctor`` flag; the message names it and the fix."""


@dataclass
class Context:
    """What the checks share: where they write and how long each may take."""

    out_dir: Path
    timeout_s: float  # per check that starts a process
    devices: list[dict] = field(default_factory=list)  # CUDA devices the probe found


@dataclass
class Check:
    name: str
    half: str  # "cpu": always runs; "gpu": with --gpu, on a machine with a CUDA device
    run: Callable[[Context], dict]  # returns its figures
    about: str  # one line for the report: what it runs


@dataclass
class CheckResult:
    name: str
    half: str
    status: str  # passed | failed | skipped
    seconds: float
    details: dict = field(default_factory=dict)  # the figures the check measured
    reason: str = ""  # skipped: why; failed: the error text


def run_check(check: Check, ctx: Context) -> CheckResult:
    """Run one check, turning whatever it raises into a recorded skip or failure."""
    started = time.perf_counter()
    details, status, reason = {}, PASSED, ""
    try:
        details = check.run(ctx)
    except Skip as exc:
        status, reason = SKIPPED, str(exc)
    except subprocess.TimeoutExpired as exc:
        status, reason = FAILED, f"timed out after {exc.timeout:g} s; raise --timeout"
    except CheckFailed as exc:
        status, reason, details = FAILED, str(exc), exc.details
    except Exception as exc:  # a check's failure is a finding, not a crash of the doctor
        status, reason = FAILED, f"{type(exc).__name__}: {exc}"
    return CheckResult(
        check.name, check.half, status, time.perf_counter() - started, details, reason
    )


def run_doctor(
    checks: list[Check], ctx: Context, gpu: bool, only: set[str] | None = None
) -> list[CheckResult]:
    """Run ``checks`` in order; GPU checks are skipped without ``gpu`` or once the device
    probe (the first GPU check) found no CUDA device."""
    results: list[CheckResult] = []
    print(f"rlsys doctor: report in {ctx.out_dir}", flush=True)
    for check in checks:
        reason = _why_not(check, gpu, only, results)
        if reason:
            result = CheckResult(check.name, check.half, SKIPPED, 0.0, reason=reason)
        else:
            print(f"  {check.half:<4}{check.name:<18}running: {check.about}", flush=True)
            result = run_check(check, ctx)
        results.append(result)
        print("  " + _row(result), flush=True)
    return results


def _why_not(check: Check, gpu: bool, only: set[str] | None, done: list[CheckResult]) -> str:
    if only is not None and check.name not in only:
        return "not named in --checks"
    if check.half != "gpu":
        return ""
    if not gpu:
        return "the GPU half runs with --gpu"
    probe = [r for r in done if r.half == "gpu"][:1]
    if probe and probe[0].status != PASSED:
        return NO_CUDA if probe[0].reason == NO_CUDA else "the device probe did not pass"
    return ""


def _row(result: CheckResult) -> str:
    # a failure's last line is its message (an error line, a traceback's exception)
    lines = [line for line in result.reason.splitlines() if line.strip()]
    text = " ".join((lines[-1] if lines else _figures(result.details)).split())
    text = text if len(text) <= 160 else text[:157] + "..."  # the report has all of it
    return f"{result.half:<4}{result.name:<18}{result.status:<8}{result.seconds:>8.1f}s  {text}"


def _figures(details: dict, limit: int = 110) -> str:
    """The check's scalar figures on one line, cut to ``limit`` characters."""
    parts = [f"{k}={v}" for k, v in details.items() if isinstance(v, str | int | float | None)]
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exit_code(results: list[CheckResult]) -> int:
    return 1 if any(r.status == FAILED for r in results) else 0


def write_report(results: list[CheckResult], ctx: Context, argv: list[str]) -> tuple[Path, Path]:
    """Write ``doctor.json`` (every record) and ``doctor.md`` (a table, then each check's
    figures and errors) to ``ctx.out_dir``."""
    counts = {s: sum(r.status == s for r in results) for s in (PASSED, FAILED, SKIPPED)}
    report = {
        "command": ["rlsys", "doctor", *argv],
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "exit_code": exit_code(results),
        "counts": counts,
        "checks": [asdict(r) for r in results],
    }
    json_path, md_path = ctx.out_dir / "doctor.json", ctx.out_dir / "doctor.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(_markdown(report, results))
    return json_path, md_path


def _markdown(report: dict, results: list[CheckResult]) -> str:
    counts = report["counts"]
    lines = [
        "# rlsys doctor",
        "",
        f"`{' '.join(report['command'])}` on {report['host']} ({report['platform']}, "
        f"Python {report['python']}), {report['written']}: {counts[PASSED]} passed, "
        f"{counts[FAILED]} failed, {counts[SKIPPED]} skipped; exit code {report['exit_code']}.",
        "",
        "| check | half | status | seconds | figures, or why it failed or was skipped |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        text = (r.reason or _figures(r.details)).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.name} | {r.half} | {r.status} | {r.seconds:.1f} | {text[:300]} |")
    for r in results:
        if r.status == SKIPPED:
            continue
        lines += ["", f"## {r.name}: {r.status}", ""]
        if r.reason:
            lines += ["```text", r.reason, "```", ""]
        lines += ["```json", json.dumps(r.details, indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def default_out_dir() -> Path:
    """``outputs/doctor-<timestamp>``: beside ``rlsys train``'s runs (``run.output_dir``)."""
    return Path("outputs") / f"doctor-{time.strftime('%Y%m%d-%H%M%S')}"


def main(gpu: bool, out: str | None, timeout_s: float, checks: str | None, argv: list[str]) -> int:
    """``rlsys doctor``: run the checks, write the report, return the exit code."""
    from rlsys.run.doctor_checks import CHECKS

    names = [c.name for c in CHECKS]
    only = None
    if checks is not None:
        only = {n.strip() for n in checks.split(",") if n.strip()}
        unknown = sorted(only - set(names))
        if unknown:
            raise DoctorError(f"--checks: unknown {unknown}; pick from {names}")
    if timeout_s <= 0:
        raise DoctorError(f"--timeout {timeout_s:g}: must be a positive number of seconds")
    out_dir = (Path(out) if out else default_out_dir()).resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DoctorError(
            f"--out {out}: cannot create it ({exc.strerror}); pass a directory you can write"
        ) from exc
    ctx = Context(out_dir, timeout_s)
    results = run_doctor(CHECKS, ctx, gpu, only)
    json_path, md_path = write_report(results, ctx, argv)
    failed = [r.name for r in results if r.status == FAILED]
    skipped = [r.name for r in results if r.status == SKIPPED]
    print(f"report: {md_path} and {json_path.name}")
    print(f"skipped: {', '.join(skipped) or 'none'}")
    print(f"failed: {', '.join(failed) or 'none'}")
    return exit_code(results)
