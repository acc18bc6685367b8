"""``rlsys submit launcher=slurm`` on a real single-node Slurm: slurmctld and slurmd on this
machine, installed and started by scripts/ci/slurm_up.sh; each job starts Ray with srun and
runs a real ``rlsys train`` on it.

One run, to keep the module to a few minutes, goes through what a run meets on a cluster:
job A is stopped with ``rlsys stop`` once it has a checkpoint; job B, submitted with the same
run.name, continues it, gets the time-limit signal (what ``sbatch --signal=B:USR1@N`` sends
the batch script), requeues itself, resumes and finishes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# Long enough that `rlsys stop` and the time-limit signal land mid-run: at ~0.1 s a step
# (checkpointing every step) 40 steps could end before the test had seen a checkpoint.
STEPS = 120
RUN_NAME = "slurm-e2e"
RUN = [
    "launcher=slurm",
    "warm_start.enabled=false",
    f"trainer.total_steps={STEPS}",
    "trainer.eval_every=0",
    "eval.num_prompts=20",
    "task.eval_size=20",
    "sft.eval_prompts=20",
    "data.batch_size=8",
    "rollout.n_samples=4",
    "algorithm.filter_uniform_groups=false",
    "learner.world_size=1",
    "rollout.num_workers=1",
    "rollout.num_cpus_per_worker=1",
    "learner.num_cpus_per_rank=1",
    "checkpoint.every=1",
    f"run.name={RUN_NAME}",
]
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


def _run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _rlsys(*args: str) -> subprocess.CompletedProcess:
    result = _run([sys.executable, "-m", "rlsys.cli", *args])
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def slurm() -> None:
    """The single-node Slurm, installed and started if need be (idempotent)."""
    result = _run(["bash", str(ROOT / "scripts" / "ci" / "slurm_up.sh")], timeout=600)
    if result.returncode == 3:
        pytest.skip(
            f"Slurm cannot run here: {result.stderr.strip()}; the test installs and starts "
            "Slurm itself when run as root on a Debian-based machine with apt-get"
        )
    assert result.returncode == 0, f"scripts/ci/slurm_up.sh failed:\n{result.stderr}"


def _job(job_id: str) -> dict[str, str]:
    out = _run(["scontrol", "show", "job", "-o", job_id]).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _wait(what: str, ready, timeout_s: float, log: Path | None = None):
    """Poll ``ready()`` until it returns something truthy; fail with the job log if not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = ready()
        if found:
            return found
        time.sleep(0.5)
    tail = log.read_text()[-4000:] if log and log.exists() else "(no log)"
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}; job log tail:\n{tail}")


def _checkpoint_after(run_dir: Path, step: int):
    """A ready() for _wait: true once a checkpoint of a step after ``step`` exists (older ones
    are pruned, ``checkpoint.keep``, so a particular step may come and go between polls)."""

    def ready() -> bool:
        steps = [int(p.name.removeprefix("step_")) for p in run_dir.glob("checkpoints/step_*")]
        return any(s > step for s in steps)

    return ready


def _wait_ended(job_id: str, log: Path, timeout_s: float) -> dict[str, str]:
    def ended() -> dict[str, str] | None:
        job = _job(job_id)
        return job if job.get("JobState") in ENDED else None

    return _wait(f"job {job_id} to end", ended, timeout_s, log)


def _submit(out: Path) -> tuple[str, Path]:
    result = _rlsys("submit", *RUN, f"run.output_dir={out}")
    job_id = re.search(r"submitted Slurm job (\d+)", result.stdout).group(1)
    log = out / "slurm" / f"{job_id}.out"
    assert f"log:    {log}" in result.stdout
    assert (out / "slurm" / f"{job_id}.sbatch").is_file(), "the rendered script is not kept"
    return job_id, log


@dataclass
class Observed:
    """What the scenario saw, for the tests to check."""

    stop_job: dict[str, str]  # scontrol's view of job A once it ended
    stop_log: str
    stop_summary: dict  # job A's summary.json, before job B overwrote it
    requeue_job: dict[str, str]  # job B once it ended
    requeue_log: str
    requeue_status: str  # `rlsys status` of job B at the end
    summary: dict  # the final summary.json
    logged_steps: list[int]  # steps in metrics.jsonl with a training record


@pytest.fixture(scope="module")
def observed(slurm, tmp_path_factory) -> Observed:
    out = tmp_path_factory.mktemp("slurm-run")
    run_dir = out / RUN_NAME
    jobs: list[str] = []
    try:
        # Job A: stopped with `rlsys stop` once a checkpoint exists.
        stop_id, stop_log = _submit(out)
        jobs.append(stop_id)
        _wait("job A's first checkpoint", _checkpoint_after(run_dir, 0), 600, stop_log)
        stopped = _rlsys("stop", stop_id, "launcher=slurm")
        assert "sent SIGTERM to its batch script" in stopped.stdout
        stop_job = _wait_ended(stop_id, stop_log, 300)
        stop_summary = json.loads((run_dir / "summary.json").read_text())

        # Job B: the same run again; it continues from job A's checkpoint. Once it wrote one
        # of its own, the time-limit signal: the job requeues itself and resumes.
        requeue_id, requeue_log = _submit(out)
        jobs.append(requeue_id)
        newer = _checkpoint_after(run_dir, stop_summary["steps"])
        _wait("a checkpoint from job B", newer, 600, requeue_log)
        signal = _run(["scancel", "--batch", "--signal=USR1", requeue_id])
        assert signal.returncode == 0, signal.stderr
        requeue_job = _wait_ended(requeue_id, requeue_log, 600)
        status = _rlsys("status", requeue_id, "launcher=slurm").stdout
    finally:
        for job_id in jobs:  # nothing left running when a step above failed
            if _job(job_id).get("JobState") not in ENDED:
                _run(["scancel", job_id])
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return Observed(
        stop_job=stop_job,
        stop_log=stop_log.read_text(),
        stop_summary=stop_summary,
        requeue_job=requeue_job,
        requeue_log=requeue_log.read_text(),
        requeue_status=status,
        summary=json.loads((run_dir / "summary.json").read_text()),
        logged_steps=[r["step"] for r in records if "train/loss" in r],
    )


def test_submitted_run_finishes_every_step_once_with_balanced_accounting(observed):
    summary = observed.summary
    assert summary["steps"] == STEPS and not summary["preempted"]
    assert summary["accounting"]["balanced"] and summary["accounting"]["samples_trained"] > 0
    assert observed.logged_steps == list(range(1, STEPS + 1)), "a step was lost or logged twice"
    assert observed.requeue_job["JobState"] == "COMPLETED"
    assert observed.requeue_job["ExitCode"] == "0:0"
    assert "COMPLETED (None)" in observed.requeue_status and "restarts 1" in observed.requeue_status


def test_time_limit_signal_checkpoints_requeues_and_the_job_resumes(observed):
    log = observed.requeue_log
    job_id = observed.requeue_job["JobId"]
    assert observed.requeue_job["Restarts"] == "1"
    stopped = re.search(r"stopped by SIGTERM after step (\d+); checkpoint (\S+)\.", log)
    assert stopped, "the run did not checkpoint on the time-limit signal"
    assert 0 < int(stopped.group(1)) < STEPS
    assert f"requeueing job {job_id}" in log and f"job {job_id} (restart 1)" in log
    # The requeued job resumed from the checkpoint the signal made.
    assert observed.summary["resumed_from"] == stopped.group(2)


def test_stop_checkpoints_the_run_and_a_resubmitted_job_continues_it(observed):
    first = observed.stop_summary
    assert first["preempted"] and first["resumed_from"] is None
    assert 0 < first["steps"] < STEPS
    assert Path(first["last_checkpoint"]).name == f"step_{first['steps']:06d}"
    # Ended as asked, not requeued.
    assert observed.stop_job["JobState"] == "CANCELLED" and observed.stop_job["Restarts"] == "0"
    assert f"stopped by SIGTERM after step {first['steps']}" in observed.stop_log
    # Job B's first attempt picked the run up where job A's checkpoint left it.
    resumed = f"resuming {first['run_dir']} from {first['last_checkpoint']}"
    assert resumed in observed.requeue_log
