"""``launcher=ray_job``: the run as a job on an existing Ray cluster, through the Ray Jobs API.

``cluster.address`` is the cluster's dashboard (``http://head:8265``; unset: ``RAY_ADDRESS``
or ``RAY_API_SERVER_ADDRESS``, as for ``ray job submit``). The job runs ``rlsys train`` with
the same overrides and ``cluster.address=auto``, with this checkout as its working directory
(``launcher.ray_job.working_dir``). Ray's token authentication is used as Ray's own clients
use it (``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``); nothing here
turns it off.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from rlsys.config.schema import TrainConfig
from rlsys.launch.base import LAUNCHERS, LaunchError, shell_join, train_command

# A job's terminal states and the exit code ``rlsys submit``/``status`` gives for each.
EXIT_CODES = {"SUCCEEDED": 0, "FAILED": 1, "STOPPED": 143}
ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")


def dashboard_address(cfg: TrainConfig) -> str:
    """The Jobs API address: ``cluster.address``, else Ray's environment variables."""
    address = cfg.cluster.address
    if address in (None, "auto"):
        address = next((os.environ[k] for k in ADDRESS_ENV if os.environ.get(k)), None)
    if not address:
        raise LaunchError(
            "launcher=ray_job needs the cluster's dashboard address: set "
            "cluster.address=http://<head>:8265 (or RAY_ADDRESS)"
        )
    if address.startswith("ray://") or not address.startswith(("http://", "https://")):
        raise LaunchError(
            f"cluster.address={address!r} is not a dashboard address; the Ray Jobs API "
            "listens on the dashboard port: use cluster.address=http://<head>:8265"
        )
    return address


def runtime_env(cfg: TrainConfig) -> dict:
    """The job's runtime env: working directory, pip packages, forwarded tracker keys."""
    job = cfg.launcher.ray_job
    env: dict = {}
    if job.working_dir is not None:
        path = Path(job.working_dir).expanduser().resolve()
        if not path.is_dir():
            raise LaunchError(
                f"launcher.ray_job.working_dir={job.working_dir!r} is not a directory; point "
                "it at your checkout, or set it to null to use the cluster's installed rlsys"
            )
        env["working_dir"] = str(path)
        env["excludes"] = list(job.excludes)
    if job.pip:
        env["pip"] = list(job.pip)
    forwarded = {k: os.environ[k] for k in job.forward_env if os.environ.get(k)}
    if forwarded:
        env["env_vars"] = forwarded
    return env


def _check_output_dir(cfg: TrainConfig) -> None:
    if not Path(cfg.run.output_dir).is_absolute():
        raise LaunchError(
            f"run.output_dir={cfg.run.output_dir!r} is relative, and a Ray job runs in a "
            "temporary copy of its working directory that is deleted afterwards; set "
            "run.output_dir to an absolute path on storage the head node keeps (shared "
            "storage for multi-node learners)"
        )


def _client(address: str):
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as exc:  # noqa: BLE001 - Ray raises several kinds; all mean "unreachable"
        raise LaunchError(
            f"cannot reach the Ray Jobs API at {address} (cluster.address): {exc}. Is the "
            "cluster up (`ray start --head`), the dashboard port right, and, with token "
            "authentication, RAY_AUTH_TOKEN (or ~/.ray/auth_token) set to the cluster's token?"
        ) from exc


def _submit(client, timeout_s: float, **job) -> str:
    """``client.submit_job(**job)``, retried while the head's agent is still starting (a
    cluster that just came up answers "No available agent")."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as exc:
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise LaunchError(f"the cluster refused the job: {exc}") from exc
        time.sleep(2.0)


async def _stream_logs(client, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


@LAUNCHERS.register("ray_job")
class RayJobLauncher:
    """Submit, follow, query and stop ``rlsys train`` as a Ray job."""

    def submit(self, cfg: TrainConfig, overrides: list[str], dry_run: bool) -> int:
        job = cfg.launcher.ray_job
        _check_output_dir(cfg)
        entrypoint = shell_join(train_command(overrides))
        env = runtime_env(cfg)
        address = dashboard_address(cfg)
        if dry_run:
            shown = dict(env)
            if "env_vars" in shown:  # never print secrets
                shown["env_vars"] = {k: "***" for k in shown["env_vars"]}
            plan = {"address": address, "entrypoint": entrypoint, "runtime_env": shown}
            print(json.dumps(plan, indent=2))
            return 0
        client = _client(address)
        job_id = _submit(
            client,
            cfg.launcher.command_timeout_s,
            entrypoint=entrypoint,
            runtime_env=env,
            submission_id=job.submission_id,
            entrypoint_num_cpus=job.entrypoint_num_cpus or None,
            metadata={"rlsys_run": cfg.run.name or ""},
        )
        print(f"submitted Ray job {job_id} to {address}", flush=True)
        hint = f"rlsys status {job_id} launcher=ray_job cluster.address={address}"
        if not job.follow:
            print(f"follow it with: {hint}")
            return 0
        try:
            asyncio.run(_stream_logs(client, job_id))
        except KeyboardInterrupt:
            print(f"\nstopped following; the job goes on. {hint}")
            return 130
        status = str(client.get_job_status(job_id).value)
        print(f"Ray job {job_id}: {status}")
        return EXIT_CODES.get(status, 1)

    def status(self, cfg: TrainConfig, job_id: str) -> int:
        info = _ask(cfg, job_id, lambda client: client.get_job_info(job_id))
        print(f"{job_id}: {info.status.value}")
        if info.message:
            print(f"  {info.message}")
        print(f"  entrypoint: {info.entrypoint}")
        return 0

    def stop(self, cfg: TrainConfig, job_id: str) -> int:
        # Ray sends SIGTERM (the run checkpoints after its current step), then SIGKILL after
        # RAY_JOB_STOP_WAIT_TIME_S (3 s unless the head sets it longer; see docs/launching.md).
        stopped = _ask(cfg, job_id, lambda client: client.stop_job(job_id))
        print(f"{job_id}: {'stop requested' if stopped else 'already finished'}")
        return 0


def _ask(cfg: TrainConfig, job_id: str, call):
    """``call(client)`` with a Jobs API client of ``cluster.address``; an unknown job id
    becomes a LaunchError."""
    client = _client(dashboard_address(cfg))
    try:
        return call(client)
    except RuntimeError as exc:
        raise LaunchError(f"no Ray job {job_id!r} at {client.get_address()}: {exc}") from exc
