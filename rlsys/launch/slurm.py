"""``launcher=slurm``: render scripts/slurm/rlsys.sbatch from the run's config and submit it
with sbatch; ``status`` asks scontrol (or, for a job it forgot, sacct); ``stop`` signals the
batch script so the run checkpoints first (docs/launching.md)."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from rlsys.config.schema import TrainConfig
from rlsys.config.shipped import shipped
from rlsys.launch.base import LAUNCHERS, LaunchError, run_tool, train_command
from rlsys.placement.resources import PoolSpec, Roles, pool_specs

TEMPLATE = shipped("scripts/slurm/rlsys.sbatch")
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
# Keys the script sets itself: a fixed run name and resume=auto, so a requeue continues.
_SCRIPT_KEYS = ("run.name", "resume")


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one role in the job and the custom Ray resources each node advertises."""

    key: str  # its size's config key: launcher.slurm.learner_nodes / rollout_nodes
    nodes: int
    pools: tuple[PoolSpec, ...]  # the pools whose actors run on it
    resources: dict[str, float]  # per node: slots x what each actor asks for


def _slots(pool: PoolSpec, nodes: int) -> int:
    return math.ceil(pool.count / nodes)


def _advertised(pools: list[PoolSpec], nodes: int, asks: dict[str, float]) -> dict[str, float]:
    """Per node, enough of each custom resource for an even share of the pools' actors."""
    total = sum(_slots(pool, nodes) for pool in pools)
    return {name: total * amount for name, amount in asks.items()}


def _merge(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in {**a, **b}}


def node_groups(cfg: TrainConfig) -> list[NodeGroup]:
    """The learner group (its first node runs the Ray head and the controller) and, with
    ``launcher.slurm.rollout_nodes``, the rollout group; raises LaunchError when the pools
    do not fit them."""
    slurm, placement = cfg.launcher.slurm, cfg.placement
    pools = pool_specs(cfg, Roles.for_rl(cfg))
    learner_side = [p for p in pools if p.name != "rollout"]
    rollout = [p for p in pools if p.name == "rollout"]
    if slurm.rollout_nodes == 0:
        learner_nodes = slurm.learner_nodes
        resources = _merge(
            _advertised(learner_side, learner_nodes, placement.learner_resources),
            _advertised(rollout, learner_nodes, placement.rollout_resources),
        )
        groups = [NodeGroup("learner_nodes", learner_nodes, tuple(pools), resources)]
    else:
        _check_separate_groups(cfg)
        groups = [
            NodeGroup(
                "learner_nodes",
                slurm.learner_nodes,
                tuple(learner_side),
                _advertised(learner_side, slurm.learner_nodes, placement.learner_resources),
            ),
            NodeGroup(
                "rollout_nodes",
                slurm.rollout_nodes,
                tuple(rollout),
                _advertised(rollout, slurm.rollout_nodes, placement.rollout_resources),
            ),
        ]
    for group in groups:
        _check_fits(cfg, group)
    return groups


def _check_separate_groups(cfg: TrainConfig) -> None:
    placement, nodes = cfg.placement, cfg.launcher.slurm.rollout_nodes
    if placement.mode != "disaggregated":
        raise LaunchError(
            f"launcher.slurm.rollout_nodes={nodes} gives rollout its own nodes, so the pools "
            f"share no devices, but placement.mode={placement.mode} halves each actor's "
            "request for sharing; add placement=disaggregated (or set rollout_nodes=0)"
        )
    if not placement.rollout_resources or not placement.learner_resources:
        raise LaunchError(
            f"launcher.slurm.rollout_nodes={nodes} needs placement.rollout_resources and "
            "placement.learner_resources so Ray keeps each pool on its group; add "
            "placement.rollout_resources={rollout_nodes:1} "
            "placement.learner_resources={learner_nodes:1}"
        )
    shared = sorted(set(placement.rollout_resources) & set(placement.learner_resources))
    if shared:
        raise LaunchError(
            f"placement.rollout_resources and placement.learner_resources both name {shared}, "
            "so the groups cannot be told apart; give each group its own resource name"
        )


def _check_fits(cfg: TrainConfig, group: NodeGroup) -> None:
    """Every node of the group gets an even share of its pools' actors: those must fit the
    node's CPUs and GPUs (colocated pools time-share them; disaggregated ones add up)."""
    slurm = cfg.launcher.slurm
    actors = sum(pool.count for pool in group.pools)
    if group.nodes > actors:
        raise LaunchError(
            f"launcher.slurm.{group.key}={group.nodes} is more nodes than the {actors} actors "
            f"that run there ({', '.join(p.count_key for p in group.pools)}); "
            f"lower launcher.slurm.{group.key} to {actors} or grow the pools"
        )
    combine = max if cfg.placement.mode == "colocated" else sum
    for unit, key, per_node, per_actor in (
        ("GPUs", "gpus_per_node", slurm.gpus_per_node, lambda p: p.gpus),
        ("CPUs", "cpus_per_node", slurm.cpus_per_node, lambda p: p.cpus),
    ):
        if per_node is None:  # whole nodes: Ray counts the CPUs, the run checks its pools
            continue

        def need(nodes: int, per_actor=per_actor) -> float:
            return combine(_slots(p, nodes) * per_actor(p) for p in group.pools)

        if need(group.nodes) <= per_node + 1e-9:
            continue
        keys = ", ".join(f"{p.count_key}={p.count}" for p in group.pools if per_actor(p))
        enough = [n for n in range(group.nodes, actors + 1) if need(n) <= per_node + 1e-9]
        fix = f"launcher.slurm.{group.key}={enough[0]} or " if enough else ""
        raise LaunchError(
            f"{keys} on launcher.slurm.{group.key}={group.nodes} need {need(group.nodes):g} "
            f"{unit} per node but launcher.slurm.{key}={per_node}; set {fix}a larger "
            f"launcher.slurm.{key}, or shrink the pools"
        )


def default_setup() -> list[str]:
    """Activate the virtualenv of the python running ``rlsys submit``, if it is one."""
    if sys.prefix == sys.base_prefix:
        return []
    activate = shlex.quote(str(Path(sys.prefix) / "bin" / "activate"))
    return ["# shellcheck source=/dev/null", f"source {activate}"]


def log_dir(cfg: TrainConfig) -> Path:
    """Where the rendered script and the job's log go (absolute: the job reads it)."""
    chosen = cfg.launcher.slurm.log_dir or str(Path(cfg.run.output_dir) / "slurm")
    return Path(chosen).expanduser().resolve()


def _sbatch_header(cfg: TrainConfig, nodes: int) -> list[str]:
    slurm = cfg.launcher.slurm
    name = slurm.job_name or (f"rlsys-{cfg.run.name}" if cfg.run.name else "rlsys")
    options = [
        f"--job-name={name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--time={slurm.time}",
        f"--output={log_dir(cfg) / '%j.out'}",
        "--open-mode=append",  # a requeued job adds to its log instead of truncating it
        f"--chdir={Path.cwd()}",  # relative paths of the run mean what they mean here
        "--requeue" if slurm.requeue else "--no-requeue",
    ]
    for flag, value in (
        ("partition", slurm.partition),
        ("account", slurm.account),
        ("qos", slurm.qos),
        ("mem", slurm.mem),
    ):
        if value is not None:
            options.append(f"--{flag}={value}")
    if slurm.cpus_per_node is None:
        options.append("--exclusive")
    else:
        options.append(f"--cpus-per-task={slurm.cpus_per_node}")
    if slurm.gpus_per_node:
        options.append(f"--gpus-per-node={slurm.gpus_per_node}")
    if slurm.signal_s:
        options.append(f"--signal=B:USR1@{slurm.signal_s}")
    return [f"#SBATCH {option}" for option in [*options, *slurm.sbatch_args]]


def _train_argv(cfg: TrainConfig, overrides: list[str]) -> list[str]:
    if cfg.resume not in (None, "auto"):
        raise LaunchError(
            f"resume={cfg.resume}: launcher=slurm always runs with resume=auto so a requeued "
            "job continues its own run; drop resume, and pass run.name=<an earlier run> to "
            "continue that one"
        )
    keep = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") not in _SCRIPT_KEYS]
    return train_command(keep)


def render(cfg: TrainConfig, overrides: list[str]) -> str:
    """The sbatch script of ``rlsys train <overrides>`` under ``cfg.launcher.slurm``."""
    slurm = cfg.launcher.slurm
    groups = node_groups(cfg)
    learner = groups[0]
    rollout = groups[1] if len(groups) > 1 else None
    node_args = []
    if slurm.cpus_per_node is not None:
        node_args.append(f"--num-cpus={slurm.cpus_per_node}")
    node_args.append(f"--num-gpus={slurm.gpus_per_node}")
    setup = default_setup() if slurm.setup is None else slurm.setup
    values = {
        "sbatch_header": "\n".join(_sbatch_header(cfg, sum(g.nodes for g in groups))),
        "setup": "\n".join(setup) or "# (no set-up: launcher.slurm.setup=[])",
        "learner_nodes": str(learner.nodes),
        "rollout_nodes": str(rollout.nodes if rollout else 0),
        "learner_node_resources": shlex.quote(json.dumps(learner.resources, sort_keys=True)),
        "rollout_node_resources": shlex.quote(
            json.dumps(rollout.resources if rollout else {}, sort_keys=True)
        ),
        "ray_node_args": " ".join(node_args),
        "ray_port": str(slurm.ray_port or ""),
        "ray_start_timeout_s": str(slurm.ray_start_timeout_s),
        "requeue": "1" if slurm.requeue else "0",
        "run_name": shlex.quote(cfg.run.name) if cfg.run.name else '"slurm-$SLURM_JOB_ID"',
        "train_argv": " ".join(shlex.quote(a) for a in _train_argv(cfg, overrides)),
    }
    return _fill(_template_text(cfg), values)


def _template_text(cfg: TrainConfig) -> str:
    path = Path(cfg.launcher.slurm.template or TEMPLATE).expanduser()
    if not path.is_file():
        raise LaunchError(
            f"the sbatch template {path} does not exist; set launcher.slurm.template to a "
            "copy of scripts/slurm/rlsys.sbatch from the rlsys repository"
        )
    return path.read_text()


def _fill(template: str, values: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        if match.group(1) not in values:
            raise LaunchError(
                f"the sbatch template (launcher.slurm.template) has {match.group(0)}, which "
                f"rlsys does not fill; use only {sorted(values)}"
            )
        return values[match.group(1)]

    return _PLACEHOLDER.sub(value, template)


@LAUNCHERS.register("slurm")
class SlurmLauncher:
    """``launcher=slurm``: one sbatch job per run; Ray lives and dies with the job."""

    def submit(self, cfg: TrainConfig, overrides: list[str], dry_run: bool) -> int:
        script = render(cfg, overrides)
        if dry_run:
            print(script, end="")
            return 0
        logs = log_dir(cfg)
        logs.mkdir(parents=True, exist_ok=True)
        pending = logs / f"submit-{os.getpid()}.sbatch"
        pending.write_text(script)
        timeout = cfg.launcher.command_timeout_s
        try:
            out = run_tool(["sbatch", "--parsable", str(pending)], timeout, "submitting the job")
        except LaunchError:
            pending.unlink()
            raise
        job_id = out.stdout.strip().split(";")[0]
        kept = pending.rename(logs / f"{job_id}.sbatch")
        print(f"submitted Slurm job {job_id}")
        print(f"script: {kept}")
        print(f"log:    {logs / f'{job_id}.out'}")
        print(
            f"follow: rlsys status {job_id} launcher=slurm; stop: rlsys stop {job_id} launcher=slurm"
        )
        return 0

    def status(self, cfg: TrainConfig, job_id: str) -> int:
        _check_job_id(job_id)
        try:
            fields = _job_fields(cfg, job_id)
        except LaunchError as forgotten:
            # slurmctld forgets ended jobs after MinJobAge; accounting (if any) remembers.
            try:
                out = run_tool(
                    ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobID,State,Elapsed,ExitCode"],
                    cfg.launcher.command_timeout_s,
                    f"asking Slurm accounting about job {job_id}",
                )
            except LaunchError as exc:
                raise LaunchError(f"{forgotten}; {exc}") from exc
            print(out.stdout.strip() or f"job {job_id}: not in Slurm accounting")
            return 0
        print(
            f"job {job_id}: {fields.get('JobState', '?')} ({fields.get('Reason', 'None')}), "
            f"ran {fields.get('RunTime', '?')} of {fields.get('TimeLimit', '?')}, "
            f"restarts {fields.get('Restarts', '0')}, exit {fields.get('ExitCode', '?')}"
        )
        if "StdOut" in fields:
            print(f"log: {fields['StdOut']}")
        return 0

    def stop(self, cfg: TrainConfig, job_id: str) -> int:
        _check_job_id(job_id)
        timeout = cfg.launcher.command_timeout_s
        state = _job_fields(cfg, job_id).get("JobState", "")
        if state == "RUNNING":
            # Only the batch script: it passes SIGTERM to the run, which checkpoints while
            # Ray (the job's other steps) is still up, then stops Ray. A plain scancel
            # signals every step at once.
            run_tool(["scancel", "--batch", "--signal=TERM", job_id], timeout, "stopping the job")
            print(f"job {job_id}: sent SIGTERM to its batch script; the run checkpoints and ends")
        else:
            run_tool(["scancel", job_id], timeout, "cancelling the job")
            print(f"job {job_id} was {state or 'not running'}: cancelled")
        return 0


def _check_job_id(job_id: str) -> None:
    if not re.fullmatch(r"\d+", job_id):
        raise LaunchError(f"{job_id!r} is not a Slurm job id; pass the number rlsys submit printed")


def _job_fields(cfg: TrainConfig, job_id: str) -> dict[str, str]:
    """``scontrol show job``'s Key=Value fields (slurmctld keeps ended jobs for MinJobAge)."""
    out = run_tool(
        ["scontrol", "show", "job", job_id],
        cfg.launcher.command_timeout_s,
        f"asking Slurm about job {job_id} (ended jobs are forgotten after MinJobAge)",
    )
    return dict(re.findall(r"(\w+)=(\S*)", out.stdout))
