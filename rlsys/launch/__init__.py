"""Launchers: where ``rlsys submit`` sends a run (Ray Jobs, KubeRay, Slurm, or here)."""

from rlsys.launch import kuberay, local, ray_job, slurm  # noqa: F401 - register the launchers
from rlsys.launch.base import LAUNCHERS, Launcher, LaunchError

__all__ = ["LAUNCHERS", "LaunchError", "Launcher"]
