"""Config of the elastic pools: rollout workers, and learner or critic ranks, added or removed
while a run trains (docs/launching.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlsys.config.checks import positive
from rlsys.config.errors import ConfigError

if TYPE_CHECKING:
    from rlsys.config.schema import TrainConfig

RESIZABLE_GROUPS = ("learner", "critic")  # learner groups that resize mid-run


def _check_schedule(key: str, schedule: dict[int, int], what: str) -> None:
    for step, size in schedule.items():
        if step < 1 or size < 1:
            raise ConfigError(
                f"{key} has {step}: {size}; steps and {what} must be >= 1, e.g. "
                f"{key}={{100:4,500:2}}"
            )


@dataclass
class AutoscaleConfig:
    """``rollout.elastic.autoscale``: the rollout pool sizes itself from measured idle time
    (rlsys/trainers/rl/autoscale.py; docs/launching.md). Meant for asynchronous runs: in a
    synchronous one the learner waits for every batch, so the pool grows to max_workers."""

    enabled: bool = False  # resize the rollout pool from each step's idle fractions
    min_workers: int = 1  # never fewer rollout workers than this
    max_workers: int = 4  # never more (each asks Ray for its CPUs/GPUs; no room: it stops there)
    window: int = 3  # steps whose idle fractions are averaged for a decision
    # steps skipped after a change or a request while the pool settles (async runs skip
    # buffer.max_staleness more: the batches generated ahead meanwhile)
    cooldown_steps: int = 1
    # Grow by one worker when the learner waited for batches this fraction of its step time or
    # more (pool/learner_idle_frac): generation is the bottleneck.
    grow_learner_idle: float = 0.25
    # Shrink by one when the rollout workers sat idle this fraction of the time or more
    # (pool/rollout_idle_frac: held at the gate or by the staleness bound) while the learner
    # waited at most half of grow_learner_idle; the gap between the two keeps a shrink from
    # triggering the next grow.
    shrink_rollout_idle: float = 0.5

    def check(self) -> None:
        prefix = "rollout.elastic.autoscale"
        positive(f"{prefix}.min_workers", self.min_workers)
        if self.max_workers < self.min_workers:
            raise ConfigError(
                f"{prefix}.max_workers={self.max_workers} is below {prefix}.min_workers="
                f"{self.min_workers}; raise max_workers"
            )
        positive(f"{prefix}.window", self.window)
        if self.cooldown_steps < 0:
            raise ConfigError(f"{prefix}.cooldown_steps={self.cooldown_steps} must be >= 0")
        for key in ("grow_learner_idle", "shrink_rollout_idle"):
            value = getattr(self, key)
            if not 0 < value < 1:
                raise ConfigError(f"{prefix}.{key}={value} must be in (0, 1)")


@dataclass
class ElasticConfig:
    """``rollout.elastic``: resize the rollout pool mid-run, on a schedule or on request
    (``rlsys scale RUN_DIR rollout=N``); see docs/launching.md."""

    # Learner step -> rollout workers from then on, e.g. {100: 4, 500: 2}; applied after that
    # step. A later `rlsys scale` request overrides it until the next scheduled step.
    schedule: dict[int, int] = field(default_factory=dict)
    # Seconds a new worker may take to start (the cluster may lack room for it); after that
    # the request is given up with a warning and the run goes on with the workers it has.
    start_timeout_s: float = 300.0
    # Size the pool from measured idle time (off by default; see AutoscaleConfig). A schedule
    # entry or `rlsys scale` request wins; the autoscaler measures afresh after it.
    autoscale: AutoscaleConfig = field(default_factory=AutoscaleConfig)

    def __post_init__(self) -> None:
        _check_schedule("rollout.elastic.schedule", self.schedule, "worker counts")
        positive("rollout.elastic.start_timeout_s", self.start_timeout_s)
        self.autoscale.check()


@dataclass
class GroupElasticConfig:
    """``learner.elastic`` / ``critic.elastic``: restart the group at another number of ranks
    mid-run, on a schedule or on request (``rlsys scale RUN_DIR learner=N``): checkpoint,
    new ranks, the checkpoint loaded resharded (FSDP2 only); see docs/launching.md."""

    # Learner step -> ranks from then on, e.g. {100: 4, 500: 2}; applied after that step. A
    # critic without a schedule entry or request of its own follows the learner's new size.
    schedule: dict[int, int] = field(default_factory=dict)

    def check(self, prefix: str, backend: str, world_size: int) -> None:
        """Validate, naming keys under ``prefix`` (learner or critic)."""
        _check_schedule(f"{prefix}.elastic.schedule", self.schedule, "rank counts")
        if backend == "deepspeed" and any(n != world_size for n in self.schedule.values()):
            raise ConfigError(deepspeed_refusal(prefix, world_size))


def deepspeed_refusal(prefix: str, world_size: int) -> str:
    """Why a DeepSpeed group keeps its size, and what to do instead."""
    return (
        f"{prefix}.backend=deepspeed cannot change {prefix}.world_size mid-run: a ZeRO "
        "checkpoint loads only into as many ranks as wrote it (this code does not convert it "
        "to DeepSpeed's universal format), so a stopped run cannot resume at another size "
        f"either; keep {prefix}.world_size={world_size}, or train with {prefix}.backend=fsdp2, "
        "whose checkpoints reshard to any world size"
    )


def group_sizes(cfg: TrainConfig, key: str) -> list[tuple[str, int]]:
    """Every size the group ``key`` takes in the run, with the key that sets it."""
    group = getattr(cfg, key)
    sizes = [(f"{key}.world_size", group.world_size)]
    sizes += [(f"{key}.elastic.schedule at step {s}", n) for s, n in group.elastic.schedule.items()]
    return sizes
