"""Config of ``launcher=slurm``: the sbatch job that starts Ray on its nodes and runs
``rlsys train`` (docs/launching.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlsys.config.checks import non_negative, positive
from rlsys.config.errors import ConfigError

# sbatch --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (and no limit).
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_NO_LIMIT = ("infinite", "unlimited")
MAX_SIGNAL_S = 65535  # sbatch --signal's largest @time


def time_limit_s(time: str) -> int | None:
    """Seconds in an sbatch ``--time`` (None: no limit); raises ConfigError naming the key."""
    if time.lower() in _NO_LIMIT:
        return None
    match = _TIME.match(time)
    if match is None:
        raise ConfigError(
            f"launcher.slurm.time={time!r} is not an sbatch time; use minutes, HH:MM:SS or "
            "D-HH:MM:SS (e.g. launcher.slurm.time=1-00:00:00)"
        )
    days, first, second, third = (int(g) if g else 0 for g in match.groups())
    if match.group(1):  # D-H[:M[:S]]
        return ((days * 24 + first) * 60 + second) * 60 + third
    if match.group(4):  # H:M:S
        return (first * 60 + second) * 60 + third
    return first * 60 + second  # M[:S]


@dataclass
class SlurmConfig:
    """The sbatch script ``rlsys submit launcher=slurm`` renders from the run's config: one
    job whose first node runs the Ray head and the controller, the other nodes Ray workers."""

    partition: str | None = None  # sbatch --partition (null: the cluster's default)
    account: str | None = None  # sbatch --account (null: the user's default)
    qos: str | None = None  # sbatch --qos (null: the default)
    time: str = "24:00:00"  # sbatch --time: the job's limit; each requeue gets it afresh
    job_name: str | None = None  # sbatch --job-name (null: rlsys-<run.name>, else rlsys)
    # Nodes of the learner group: learner ranks, reference and critic actors. The first one
    # also runs the Ray head and the controller (`rlsys train`).
    learner_nodes: int = 1
    # Nodes of the rollout group (0: rollout workers share the learner nodes). Separate
    # groups need placement=disaggregated and both placement.*_resources set, so Ray pins
    # each pool to its own nodes.
    rollout_nodes: int = 0
    gpus_per_node: int = 0  # sbatch --gpus-per-node and Ray's GPUs per node (0: none)
    # CPUs per node (sbatch --cpus-per-task, Ray's CPUs per node); null: whole nodes
    # (sbatch --exclusive) and Ray counts their CPUs.
    cpus_per_node: int | None = None
    mem: str | None = None  # sbatch --mem per node, e.g. 200G ("0": all of it; null: default)
    # Put the job back in the queue when the time-limit signal (signal_s) stopped the run;
    # the requeued job continues it with resume=auto.
    requeue: bool = True
    # Seconds before the time limit Slurm signals the batch script (sbatch
    # --signal=B:USR1@signal_s): the run finishes its step, checkpoints and, with requeue,
    # the job requeues itself. Leave time for a checkpoint. 0: no signal.
    signal_s: int = 300
    # Shell lines the batch script runs before Ray starts (module load, conda activate...);
    # srun hands the environment they set to every node's Ray. null: activate the
    # virtualenv of the python running `rlsys submit`, if it is one.
    setup: list[str] | None = None
    # Extra sbatch options, one per entry, written as `#SBATCH <entry>` (e.g. --constraint=a100).
    sbatch_args: list[str] = field(default_factory=list)
    # Port of the Ray head (GCS); Ray's client server and dashboard agent take the next two.
    # null: 20000 + 4 x (job id mod 3000), so jobs sharing a node do not collide.
    ray_port: int | None = None
    ray_start_timeout_s: int = 300  # seconds to wait for every node to join Ray
    # Where the rendered script (<job id>.sbatch) and the job's log (<job id>.out) go
    # (null: <run.output_dir>/slurm).
    log_dir: str | None = None
    template: str | None = None  # the sbatch template (null: scripts/slurm/rlsys.sbatch)

    def __post_init__(self) -> None:
        limit_s = time_limit_s(self.time)
        positive("launcher.slurm.learner_nodes", self.learner_nodes)
        non_negative("launcher.slurm.rollout_nodes", self.rollout_nodes)
        non_negative("launcher.slurm.gpus_per_node", self.gpus_per_node)
        if self.cpus_per_node is not None:
            positive("launcher.slurm.cpus_per_node", self.cpus_per_node)
        non_negative("launcher.slurm.signal_s", self.signal_s)
        if self.signal_s > MAX_SIGNAL_S:
            raise ConfigError(
                f"launcher.slurm.signal_s={self.signal_s} exceeds sbatch's limit of "
                f"{MAX_SIGNAL_S}; lower launcher.slurm.signal_s"
            )
        if limit_s is not None and self.signal_s >= limit_s:
            raise ConfigError(
                f"launcher.slurm.signal_s={self.signal_s} is not shorter than "
                f"launcher.slurm.time={self.time} ({limit_s} s): the run would be stopped at "
                "once; lower launcher.slurm.signal_s or raise launcher.slurm.time"
            )
        positive("launcher.slurm.ray_start_timeout_s", self.ray_start_timeout_s)
        if self.ray_port is not None and not 1024 <= self.ray_port <= 65533:
            raise ConfigError(
                f"launcher.slurm.ray_port={self.ray_port} is outside 1024..65533; pick a free "
                "port there or leave it null (derived from the job id)"
            )
        for arg in self.sbatch_args:
            if not arg.startswith("-"):
                raise ConfigError(
                    f"launcher.slurm.sbatch_args entry {arg!r} is not an sbatch option; write "
                    "options as they follow #SBATCH, e.g. launcher.slurm.sbatch_args=['--exclusive']"
                )
