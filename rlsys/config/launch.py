"""Configs of ``rlsys submit``: which launcher takes the run to a cluster, and its settings.

``launcher.kind`` picks one (``conf/launcher/<kind>.yaml`` sets it: ``launcher=ray_job``);
each launcher reads only its own sub-config. The submitted job runs ``rlsys train`` with the
same overrides, so one Hydra config describes the run wherever it goes (docs/launching.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import non_negative, positive
from rlsys.config.kuberay import KubeRayConfig
from rlsys.config.slurm import SlurmConfig


@dataclass
class RayJobConfig:
    """``launcher=ray_job``: the run as a Ray job on an existing cluster (``cluster.address``
    is the cluster's dashboard, e.g. http://head:8265; the job itself joins with ``auto``)."""

    # Uploaded as the job's working directory, so the cluster runs this checkout's code
    # (null: the rlsys installed in the cluster's image).
    working_dir: str | None = "."
    # Paths of working_dir left out of the upload (gitignore syntax).
    excludes: list[str] = field(
        default_factory=lambda: [".venv/", ".git/", "outputs/", "wandb/", "**/__pycache__/"]
    )
    pip: list[str] = field(default_factory=list)  # extra pip packages for the job's runtime env
    # Environment variables copied from the submitting shell into the job when set there
    # (tracker keys: they travel in the job's runtime env, never in the config).
    forward_env: list[str] = field(
        default_factory=lambda: ["WANDB_API_KEY", "WANDB_BASE_URL", "HF_TOKEN"]
    )
    follow: bool = True  # stream the job's logs until it ends (false: print the id and return)
    submission_id: str | None = None  # the job id (null: Ray makes one)
    entrypoint_num_cpus: float = 0.0  # CPUs reserved for the driver (the controller)

    def __post_init__(self) -> None:
        non_negative("launcher.ray_job.entrypoint_num_cpus", self.entrypoint_num_cpus)


@dataclass
class LauncherConfig:
    """Where ``rlsys submit`` sends the run."""

    kind: str = "local"  # local | ray_job | kuberay | slurm
    # Seconds ``rlsys submit`` waits for the launcher's own commands (ray, kubectl, sbatch).
    command_timeout_s: float = 120.0
    ray_job: RayJobConfig = field(default_factory=RayJobConfig)
    kuberay: KubeRayConfig = field(default_factory=KubeRayConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)

    def __post_init__(self) -> None:
        positive("launcher.command_timeout_s", self.command_timeout_s)
