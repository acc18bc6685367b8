"""Start or join Ray, and check before any actor starts that the pools fit; the local
launcher (``rlsys submit`` with the default ``launcher=local``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from rlsys.config.schema import ClusterConfig, TrainConfig
from rlsys.launch.base import LAUNCHERS, LaunchError, run_overrides, shell_join
from rlsys.placement.resources import (
    Roles,
    check_fits,
    connected_node_gpus,
    custom_resources_needed,
    wants_gpus,
)
from rlsys.resolve.plugins import ENV as PLUGINS_ENV
from rlsys.resolve.plugins import SETUP_HOOK as PLUGINS_SETUP_HOOK


def _local_gpus(cluster: ClusterConfig) -> int:
    if cluster.num_gpus is not None:
        return cluster.num_gpus
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()])
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0


def preflight(cfg: TrainConfig, roles: Roles) -> None:
    """Checks that need the registries or the machine, before anything starts: the rewards
    exist and build (a user reward file imports, code rewards can be sandboxed here), the
    environment exists and, for a local Ray, the pools fit this machine."""
    from rlsys.agents.runner import load_agent
    from rlsys.config.env import AGENT_ENV
    from rlsys.envs import ENVS
    from rlsys.rewards import REWARDS
    from rlsys.rewards.scorer import components_from_config

    for key, name in [("task.reward", cfg.task.reward)] + [
        (f"reward.extra.{n}", n) for n in cfg.reward.extra
    ]:
        REWARDS.check(name, key)
    if cfg.task.env.name == AGENT_ENV:
        load_agent(cfg.task.env.agent or "")  # the agent imports, before anything starts
    elif cfg.task.env.name is not None:
        ENVS.check(cfg.task.env.name)
    components_from_config(cfg.task.reward, cfg.reward)
    if cfg.cluster.address is not None:
        return
    cpus = cfg.cluster.num_cpus or os.cpu_count() or 1
    gpus = _local_gpus(cfg.cluster) if wants_gpus(cfg, roles) else 0
    check_fits(cfg, cpus, gpus, roles, node_gpus=[gpus])


def connect_ray(cfg: TrainConfig, roles: Roles) -> dict[str, float]:
    """Start a local Ray (or join ``cluster.address``), check the pools fit it and return its
    resources (``ray.cluster_resources()``)."""
    import ray

    if not ray.is_initialized():
        env = {
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        for key in ("RLSYS_CACHE_DIR", "XDG_CACHE_HOME", "RLSYS_CONF_DIR"):
            if key in os.environ:
                env[key] = os.environ[key]
        runtime_env: dict = {"env_vars": env}
        if cfg.plugins:  # every worker imports them before it unpickles anything of theirs
            env[PLUGINS_ENV] = json.dumps(cfg.plugins)
            runtime_env["worker_process_setup_hook"] = PLUGINS_SETUP_HOOK
        kwargs = {
            "runtime_env": runtime_env,
            "log_to_driver": True,
            "include_dashboard": False,
        }
        if cfg.cluster.address is None:
            ray.init(
                num_cpus=cfg.cluster.num_cpus or os.cpu_count(),
                num_gpus=cfg.cluster.num_gpus,
                # this one node plays every node group the pools are pinned to
                resources=custom_resources_needed(cfg, roles) or None,
                **kwargs,
            )
        else:
            ray.init(address=cfg.cluster.address, **kwargs)
    resources = ray.cluster_resources()
    check_fits(
        cfg,
        resources.get("CPU", 0),
        resources.get("GPU", 0),
        roles,
        resources,
        connected_node_gpus(),
    )
    return resources


@LAUNCHERS.register("local")
class LocalLauncher:
    """``launcher=local`` (the default): ``rlsys submit`` runs ``rlsys train`` here, in the
    foreground, with the same overrides."""

    def submit(self, cfg: TrainConfig, overrides: list[str], dry_run: bool) -> int:
        argv = ["rlsys", "train", *run_overrides(overrides)]
        if dry_run:
            print(shell_join(argv))
            return 0
        return subprocess.call([sys.executable, "-m", "rlsys.cli", *argv[1:]])

    def status(self, cfg: TrainConfig, job_id: str) -> int:
        raise LaunchError("launcher=local runs in the foreground: there is no job to ask about")

    def stop(self, cfg: TrainConfig, job_id: str) -> int:
        raise LaunchError("launcher=local runs in the foreground: stop it with Ctrl-C")
