"""What every launcher shares: the ``rlsys train`` command a job runs, the launcher
interface, and running the cluster's own tools (ray, kubectl, sbatch) with clear errors."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Sequence
from typing import Protocol

from rlsys.config.schema import TrainConfig
from rlsys.registry import Registry


class LaunchError(RuntimeError):
    """A launcher could not do what was asked; the message says why and what to do."""


# Overrides that configure the submission, not the run: the job does not see them.
_SUBMIT_ONLY = ("launcher", "cluster.address")


def override_key(override: str) -> str:
    """The config key of a Hydra override (``+a.b=1`` -> ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


def run_overrides(overrides: Sequence[str]) -> list[str]:
    """The user's overrides less the launcher's own keys and ``cluster.address``: what
    describes the run wherever it goes."""
    return [
        o
        for o in overrides
        if not any(
            override_key(o) == k or override_key(o).startswith(k + ".") for k in _SUBMIT_ONLY
        )
    ]


def job_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides a cluster job's ``rlsys train`` gets: the run's, joining the cluster it
    runs on with ``cluster.address=auto``."""
    return [*run_overrides(overrides), "cluster.address=auto"]


def train_command(overrides: Sequence[str]) -> list[str]:
    """``rlsys train <job overrides>`` as an argv, the entrypoint of every cluster job. It runs
    the module rather than the ``rlsys`` script so that code uploaded as the job's working
    directory (``launcher.ray_job.working_dir``) comes before the installed copy."""
    return ["python", "-m", "rlsys.cli", "train", *job_overrides(overrides)]


def shell_join(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def run_tool(
    argv: Sequence[str], timeout_s: float, what: str, stdin: str | None = None
) -> subprocess.CompletedProcess:
    """Run a cluster tool (``kubectl``, ``sbatch``...); a missing tool, a time-out or a
    non-zero exit raises LaunchError naming the command, its output and ``what`` it was for."""
    if shutil.which(argv[0]) is None:
        raise LaunchError(
            f"{what}: `{argv[0]}` is not on PATH; install it or run from a host that has it"
        )
    try:
        proc = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(
            f"{what}: `{shell_join(argv)}` did not answer within {timeout_s:g} s "
            "(launcher.command_timeout_s)"
        ) from exc
    if proc.returncode != 0:
        output = (proc.stderr or proc.stdout).strip()
        raise LaunchError(f"{what}: `{shell_join(argv)}` exited {proc.returncode}: {output}")
    return proc


class Launcher(Protocol):
    """Takes a run to a cluster. Each method returns the exit code for ``rlsys``."""

    def submit(self, cfg: TrainConfig, overrides: list[str], dry_run: bool) -> int:
        """Submit ``rlsys train <overrides>``; print the job id (or, with ``dry_run``, what
        would be submitted, without submitting)."""

    def status(self, cfg: TrainConfig, job_id: str) -> int:
        """Print the state of job ``job_id``."""

    def stop(self, cfg: TrainConfig, job_id: str) -> int:
        """Stop job ``job_id`` (the run checkpoints on SIGTERM where the launcher sends one)."""


LAUNCHERS: Registry[type[Launcher]] = Registry("launcher", "launcher.kind")
