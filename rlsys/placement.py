"""Ray resource requests of every pool, derived from the placement config.

Colocated pools time-share the same CPUs/GPUs (engines idle while learners train), so each
actor asks Ray for its configured share divided by the number of pools sharing; each pool on
its own must still fit the cluster. Disaggregated pools ask for exactly what they are given,
and all of them together must fit. No resource number is written anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig


@dataclass(frozen=True)
class ActorResources:
    """What one actor asks Ray for, and the torch threads it then uses."""

    num_cpus: float
    num_gpus: float
    threads: int


@dataclass(frozen=True)
class PoolSpec:
    """A pool of identical actors: its size, configured resources and config keys."""

    name: str
    count: int
    cpus: float
    gpus: float
    count_key: str
    cpus_key: str


@dataclass(frozen=True)
class Roles:
    """Which optional pools a run starts besides rollout and learner."""

    reference: bool = False  # a frozen reference policy (KL terms)
    critic: bool = False  # a value model (PPO's GAE)

    @classmethod
    def for_rl(cls, cfg: TrainConfig) -> Roles:
        """The pools ``cfg``'s algorithm needs (SFT uses ``Roles()``: none)."""
        return cls(cfg.algorithm.uses_reference, cfg.algorithm.uses_critic)


@dataclass(frozen=True)
class Placement:
    """Resource requests for every pool of a run."""

    learner: ActorResources
    rollout: ActorResources
    reference: ActorResources | None
    critic: ActorResources | None


def thread_env(threads: int) -> dict:
    """Runtime env giving an actor's OpenMP ``threads`` from process start. Ray would set
    OMP_NUM_THREADS to the (possibly fractional, colocated) CPU request; OpenMP reads it once,
    so every thread of the actor (Ray runs methods on several) must start with the right value.
    """
    return {"env_vars": {"OMP_NUM_THREADS": str(threads)}}


def _pools(cfg: TrainConfig, roles: Roles) -> list[PoolSpec]:
    pools = [
        PoolSpec(
            "learner",
            cfg.learner.world_size,
            cfg.learner.num_cpus_per_rank,
            cfg.learner.num_gpus_per_rank,
            "learner.world_size",
            "learner.num_cpus_per_rank",
        ),
        PoolSpec(
            "rollout",
            cfg.rollout.num_workers,
            cfg.rollout.num_cpus_per_worker,
            cfg.rollout.num_gpus_per_worker,
            "rollout.num_workers",
            "rollout.num_cpus_per_worker",
        ),
    ]
    if roles.reference:
        pools.append(
            PoolSpec(
                "reference",
                1,
                cfg.reference.num_cpus,
                cfg.reference.num_gpus,
                "reference (1 actor)",
                "reference.num_cpus",
            )
        )
    if roles.critic:
        pools.append(
            PoolSpec(
                "critic",
                cfg.critic.world_size,
                cfg.critic.num_cpus_per_rank,
                cfg.critic.num_gpus_per_rank,
                "critic.world_size",
                "critic.num_cpus_per_rank",
            )
        )
    return pools


def wants_gpus(cfg: TrainConfig, roles: Roles) -> bool:
    """Whether any pool of the run asks for GPUs."""
    return any(pool.gpus > 0 for pool in _pools(cfg, roles))


def check_fits(cfg: TrainConfig, total_cpus: float, total_gpus: float, roles: Roles) -> None:
    """Fail with the keys to change when the pools cannot fit the cluster."""
    pools = _pools(cfg, roles)
    for pool in pools:
        need = pool.count * pool.cpus
        if need > total_cpus + 1e-9:
            raise ConfigError(
                f"{pool.count_key}={pool.count} x {pool.cpus_key}={pool.cpus:g} needs "
                f"{need:g} CPUs but Ray has {total_cpus:g}; lower {pool.count_key} or "
                f"{pool.cpus_key} (fractions such as 0.5 are allowed)"
            )
        if pool.count * pool.gpus > total_gpus + 1e-9:
            raise ConfigError(
                f"the {pool.name} pool needs {pool.count * pool.gpus:g} GPUs but Ray has "
                f"{total_gpus:g}; lower {pool.count_key} or its GPUs per actor"
            )
    if cfg.placement.mode == "disaggregated":
        need = sum(p.count * p.cpus for p in pools)
        if need > total_cpus + 1e-9:
            raise ConfigError(
                f"placement.mode=disaggregated: the pools need {need:g} CPUs together but Ray "
                f"has {total_cpus:g}; use placement=colocated or shrink the pools"
            )
        need_gpus = sum(p.count * p.gpus for p in pools)
        if need_gpus > total_gpus + 1e-9:
            raise ConfigError(
                f"placement.mode=disaggregated: the pools need {need_gpus:g} GPUs together but "
                f"Ray has {total_gpus:g}; use placement=colocated or shrink the pools"
            )


def plan_placement(cfg: TrainConfig, roles: Roles) -> Placement:
    """Per-actor Ray requests for each pool (call ``check_fits`` first)."""
    pools = {p.name: p for p in _pools(cfg, roles)}
    share = len(pools) if cfg.placement.mode == "colocated" else 1

    def resources(pool: PoolSpec) -> ActorResources:
        return ActorResources(pool.cpus / share, pool.gpus / share, max(1, int(pool.cpus)))

    return Placement(
        learner=resources(pools["learner"]),
        rollout=resources(pools["rollout"]),
        reference=resources(pools["reference"]) if roles.reference else None,
        critic=resources(pools["critic"]) if roles.critic else None,
    )
