"""Ray resource requests of every pool, derived from the placement config.

Colocated pools time-share the same CPUs/GPUs (engines idle while learners train), so each
actor asks Ray for its configured CPUs divided by the number of pools sharing; each pool on
its own must still fit the cluster. Disaggregated pools ask for exactly what they are given,
and all of them together must fit. GPU actors are bound to whole GPUs through placement groups
(``rlsys.placement.gpu_slots``: colocated learner rank i shares its GPU with exactly one
engine shard). No resource number is written anywhere else.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

from rlsys.algorithms.traits import uses_critic
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.placement.gpu_slots import (
    GpuBinding,
    NoRoom,
    SlotPool,
    SlotPoolSpec,
    SlotUser,
    assign_groups,
)
from rlsys.runtime import ABORT_ENV


@dataclass(frozen=True)
class ActorResources:
    """What one actor asks Ray for, and the torch threads it then uses."""

    num_cpus: float
    num_gpus: float  # with ``gpus``: the share of its first slot's GPU it asks for
    threads: int
    resources: dict[str, float] = field(default_factory=dict)  # custom (node-group) resources
    gpus: GpuBinding | None = None  # the placement-group slots of a GPU pool's actors

    def actor_options(self, index: int = 0, **extra) -> dict:
        """Keyword arguments of ``ActorClass.options`` for actor ``index`` of its pool (a GPU
        pool's actors each go to their own placement-group slots)."""
        options = {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "resources": dict(self.resources),
            "runtime_env": thread_env(self.threads),
            **extra,
        }
        if self.gpus is not None:
            options["scheduling_strategy"] = self.gpus.strategy(index)
        return options

    def visible_devices(
        self, index: int = 0, timeout_s: float | None = None, fresh: bool = False
    ) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` actor ``index`` sets for itself (an actor over several
        GPUs: ``gpu_slots.bind_visible_devices``); None: Ray's setting stands
        (``GpuBinding.visible_devices`` for ``timeout_s`` and ``fresh``)."""
        if self.gpus is None:
            return None
        return self.gpus.visible_devices(index, timeout_s, fresh)

    def shifted(self, actors: int) -> ActorResources:
        """These resources for a pool that continues ``actors`` actors further on in the same
        slots (a reward model's second group of ranks)."""
        if self.gpus is None:
            return self
        return dataclasses.replace(self, gpus=self.gpus.shifted(actors))


@dataclass(frozen=True)
class PoolSpec:
    """A pool of identical actors: its size, configured resources and config keys."""

    name: str
    count: int
    cpus: float
    gpus: float
    count_key: str
    cpus_key: str
    resources: dict[str, float] = field(default_factory=dict)  # custom resources per actor
    resources_key: str = ""
    most: int = 0  # the most actors it can grow to mid-run (0: count)


@dataclass(frozen=True)
class Roles:
    """Which optional pools a run starts besides rollout and learner."""

    reference: bool = False  # a frozen reference policy (KL terms)
    critic: bool = False  # a value model (PPO's GAE)
    rewards: bool = False  # reward workers and reward models, when ``reward.*`` asks

    @classmethod
    def for_rl(cls, cfg: TrainConfig) -> Roles:
        """The pools ``cfg``'s algorithm needs (SFT uses ``Roles()``: none)."""
        return cls(cfg.reference_group, uses_critic(cfg.algorithm), True)


@dataclass(frozen=True)
class Placement:
    """Resource requests for every pool of a run."""

    learner: ActorResources
    rollout: ActorResources
    reference: ActorResources | None
    critic: ActorResources | None
    reward: ActorResources | None = None  # one reward worker (reward.num_workers > 0)
    reward_model: ActorResources | None = None  # one rank of a reward model (reward.model)
    judge: ActorResources | None = None  # one server of a judge the run serves (reward.judge)
    slot_pools: tuple[SlotPool, ...] = ()  # the GPU placement groups (created as used)

    def release(self) -> None:
        """Remove the GPU placement groups (once every actor in them is stopped)."""
        for pool in self.slot_pools:
            pool.remove()


# glibc malloc settings for actors (a value already in the environment wins). By default glibc
# hands freed memory back to the OS and maps blocks over an adaptive threshold afresh, so a
# training step faults in its activations again every time: a SmolLM2 bf16 learner step took
# 3.2-3.5 s with the defaults and 2.75-2.8 s with these (2 cores, `scripts/bench_peer.py`
# config), and warmed up in one step instead of three. The cost: a process keeps its peak
# heap instead of shrinking back.
MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # below 32 MiB from the heap, reused
    "MALLOC_TRIM_THRESHOLD_": str(16 << 30),  # do not give freed heap back
    "MALLOC_TOP_PAD_": str(1 << 30),  # grow the heap in 1 GiB steps (untouched pages are free)
}


def thread_env(threads: int) -> dict:
    """Runtime env of an actor: OpenMP ``threads`` from process start, and ``MALLOC_ENV``.
    Ray would set OMP_NUM_THREADS to the (possibly fractional, colocated) CPU request; OpenMP
    reads it once, so every thread of the actor (Ray runs methods on several) must start with
    the right value. A fault injection asked for (``runtime.ABORT_ENV``) goes along."""
    malloc = {key: os.environ.get(key, value) for key, value in MALLOC_ENV.items()}
    faults = {ABORT_ENV: os.environ[ABORT_ENV]} if ABORT_ENV in os.environ else {}
    return {"env_vars": {"OMP_NUM_THREADS": str(threads), **malloc, **faults}}


def most_actors(cfg: TrainConfig, pool: str) -> int:
    """The most actors ``pool`` can have during the run: its configured size, its elastic
    schedule's sizes, autoscaling's max_workers (rollout); a critic with no schedule of its
    own follows the learner's."""
    if pool == "rollout":
        rollout = cfg.rollout
        sizes = [rollout.num_workers, *rollout.elastic.schedule.values()]
        if rollout.elastic.autoscale.enabled:
            sizes.append(rollout.elastic.autoscale.max_workers)
        return max(sizes)
    group = getattr(cfg, pool)
    sizes = [group.world_size, *group.elastic.schedule.values()]
    if pool == "critic" and not group.elastic.schedule:
        sizes += cfg.learner.elastic.schedule.values()
    return max(sizes)


def pool_specs(cfg: TrainConfig, roles: Roles) -> list[PoolSpec]:
    """Every pool of the run (learner and rollout first), as configured."""
    pools = [
        PoolSpec(
            "learner",
            cfg.learner.world_size,
            cfg.learner.num_cpus_per_rank,
            cfg.learner.num_gpus_per_rank,
            "learner.world_size",
            "learner.num_cpus_per_rank",
            cfg.placement.learner_resources,
            "placement.learner_resources",
            most_actors(cfg, "learner"),
        ),
        PoolSpec(
            "rollout",
            cfg.rollout.num_workers,
            cfg.rollout.num_cpus_per_worker,
            cfg.rollout.num_gpus_per_worker,
            "rollout.num_workers",
            "rollout.num_cpus_per_worker",
            cfg.placement.rollout_resources,
            "placement.rollout_resources",
            most_actors(cfg, "rollout"),
        ),
    ]
    if roles.reference:
        pools.append(
            PoolSpec(
                "reference",
                cfg.reference.world_size,
                cfg.reference.num_cpus,
                cfg.reference.num_gpus,
                "reference.world_size",
                "reference.num_cpus",
                cfg.placement.learner_resources,
                "placement.learner_resources",
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
                cfg.placement.learner_resources,
                "placement.learner_resources",
                most_actors(cfg, "critic"),
            )
        )
    if roles.rewards and cfg.reward.num_workers:
        pools.append(
            PoolSpec(
                "reward",
                cfg.reward.num_workers,
                cfg.reward.num_cpus_per_worker,
                0.0,
                "reward.num_workers",
                "reward.num_cpus_per_worker",
            )
        )
    if roles.rewards and cfg.reward.model.paths:
        pools.append(
            PoolSpec(
                "reward_model",
                len(cfg.reward.model.paths) * cfg.reward.model.world_size,
                cfg.reward.model.num_cpus,
                cfg.reward.model.num_gpus,
                "reward.model.paths x reward.model.world_size",
                "reward.model.num_cpus",
            )
        )
    if roles.rewards and cfg.reward.judge.model_path is not None:
        pools.append(
            PoolSpec(
                "judge",
                cfg.reward.judge.num_workers,
                cfg.reward.judge.num_cpus,
                cfg.reward.judge.num_gpus,
                "reward.judge.num_workers",
                "reward.judge.num_cpus",
            )
        )
    return pools


TIME_SHARED = ("learner", "rollout", "reference", "critic")  # colocated pools take turns


def _share(cfg: TrainConfig, pools: list[PoolSpec]) -> int:
    """How many colocated pools split each device (reward pools run all the time, so they
    ask for what they are given)."""
    if cfg.placement.mode != "colocated":
        return 1
    return sum(p.name in TIME_SHARED for p in pools)


def _split(pool: PoolSpec, share: int) -> int:
    """What ``pool``'s per-actor request is divided by: the share if it time-shares, else 1."""
    return share if pool.name in TIME_SHARED else 1


def wants_gpus(cfg: TrainConfig, roles: Roles) -> bool:
    """Whether any pool of the run asks for GPUs."""
    return any(pool.gpus > 0 for pool in pool_specs(cfg, roles))


def custom_resources_needed(cfg: TrainConfig, roles: Roles) -> dict[str, float]:
    """Custom resources every actor of the run asks for together (a local Ray advertises
    them, so a config pinned to node groups also runs on one machine)."""
    need: dict[str, float] = {}
    for pool in pool_specs(cfg, roles):
        for name, amount in pool.resources.items():
            need[name] = need.get(name, 0.0) + pool.count * amount
    return need


def slot_specs(
    cfg: TrainConfig, pools: list[PoolSpec], node_gpus: list[float] | None = None
) -> dict[str, SlotPoolSpec]:
    """The GPU slot pools of a run, by the pool names that use them: colocated pools that
    time-share GPUs use one "colocated" slot pool; every other GPU pool has its own
    (``node_gpus``: the cluster's GPUs per node, where known, so groups fill nodes)."""
    smallest = int(min((g for g in node_gpus or [] if g > 0), default=0))
    share = _share(cfg, pools)
    gpu_pools = [p for p in pools if p.gpus > 0]
    shared = [p for p in gpu_pools if cfg.placement.mode == "colocated" and p.name in TIME_SHARED]
    specs: dict[str, SlotPoolSpec] = {}
    if shared:
        users = tuple(
            SlotUser(
                p.name, p.count, int(p.gpus), 1.0 / len(shared), p.cpus / share, p.resources, p.most
            )
            for p in shared
        )
        spec = SlotPoolSpec("colocated", max(int(p.gpus) for p in shared), users, smallest)
        specs.update({p.name: spec for p in shared})
    for p in gpu_pools:
        if p.name not in specs:
            user = SlotUser(p.name, p.count, int(p.gpus), 1.0, p.cpus, p.resources, p.most)
            specs[p.name] = SlotPoolSpec(p.name, int(p.gpus), (user,), smallest)
    return specs


def connected_node_gpus() -> list[float] | None:
    """GPUs per live node of the Ray this process is connected to (None: not connected)."""
    import ray

    if not ray.is_initialized():
        return None
    return [n["Resources"].get("GPU", 0.0) for n in ray.nodes() if n["Alive"]]


def unique_specs(by_pool: dict[str, SlotPoolSpec]) -> list[SlotPoolSpec]:
    """The distinct slot pools of ``slot_specs`` (colocated pools share one), in order."""
    return list({id(s): s for s in by_pool.values()}.values())


def _check_gpus(
    cfg: TrainConfig, pools: list[PoolSpec], total_gpus: float, node_gpus: list[float] | None
) -> None:
    """The GPU slots fit the cluster's GPUs, and each slot group fits one node."""
    specs = unique_specs(slot_specs(cfg, pools, node_gpus))
    if not specs:
        return
    keys = {p.name: p for p in pools}

    def describe(spec: SlotPoolSpec) -> str:
        return " and ".join(
            f"{keys[u.pool].count_key}={u.count} x {u.per_actor} GPU(s)" for u in spec.users
        )

    need = sum(s.region for s in specs)
    if need > total_gpus + 1e-9:
        parts = "; ".join(f"{s.name}: {s.region} ({describe(s)})" for s in specs)
        fix = (
            "shrink the pools"
            if cfg.placement.mode == "colocated"
            else "shrink the pools, or use placement.mode=colocated so the learner and the "
            "engines share GPUs"
        )
        raise ConfigError(
            f"the GPU pools need {need} whole GPUs but Ray has {total_gpus:g} ({parts}); {fix}"
        )
    if node_gpus:
        try:
            assign_groups(specs, node_gpus)
        except NoRoom as exc:
            raise ConfigError(
                f"the GPU slots cannot be placed: {exc}; an engine's GPUs "
                "(rollout.num_gpus_per_worker = rollout.vllm.tensor_parallel_size) must fit "
                "one node: lower the tensor-parallel size or use nodes with more GPUs"
            ) from exc


def check_fits(
    cfg: TrainConfig,
    total_cpus: float,
    total_gpus: float,
    roles: Roles,
    custom: dict[str, float] | None = None,
    node_gpus: list[float] | None = None,
) -> None:
    """Fail with the keys to change when the pools cannot fit the cluster (``custom``: the
    cluster's custom resources; ``node_gpus``: the GPUs of each node, for the slot groups
    that must each sit on one node; None skips either check)."""
    pools = pool_specs(cfg, roles)
    _check_gpus(cfg, pools, total_gpus, node_gpus)
    if custom is not None:
        for name, need in custom_resources_needed(cfg, roles).items():
            if need > custom.get(name, 0.0) + 1e-9:
                keys = sorted({p.resources_key for p in pools if name in p.resources})
                raise ConfigError(
                    f"{' and '.join(keys)} ask for {need:g} of the custom resource {name!r} "
                    f"in total but the cluster's nodes advertise {custom.get(name, 0.0):g}; "
                    f"start nodes with --resources='{{\"{name}\": N}}' (or the launcher's node "
                    "groups), or shrink the pools"
                )
    for pool in pools:
        need = pool.count * pool.cpus
        if need > total_cpus + 1e-9:
            raise ConfigError(
                f"{pool.count_key}={pool.count} x {pool.cpus_key}={pool.cpus:g} needs "
                f"{need:g} CPUs but Ray has {total_cpus:g}; lower {pool.count_key} or "
                f"{pool.cpus_key} (fractions such as 0.5 are allowed)"
            )
    share = _share(cfg, pools)
    if cfg.placement.mode == "colocated" and len(pools) > share:  # reward pools on top
        shared = sum(p.count * p.cpus / share for p in pools if p.name in TIME_SHARED)
        asked = sum(p.count * p.cpus / _split(p, share) for p in pools)
        if asked > total_cpus + 1e-9:
            raise ConfigError(
                f"the colocated pools ask Ray for {shared:g} CPUs and the reward pools for "
                f"{asked - shared:g} more, {asked:g} in all, but it has {total_cpus:g}; lower "
                "reward.num_cpus_per_worker / reward.model.num_cpus / reward.judge.num_cpus "
                "(fractions such as 0.25 "
                "are allowed) or the colocated pools' CPUs (rollout.num_cpus_per_worker, "
                "learner.num_cpus_per_rank), or, on a local Ray, give it more logical CPUs "
                "with cluster.num_cpus (the colocated pools take turns on the cores)"
            )
    if cfg.placement.mode == "disaggregated":
        need = sum(p.count * p.cpus for p in pools)
        if need > total_cpus + 1e-9:
            raise ConfigError(
                f"placement.mode=disaggregated: the pools need {need:g} CPUs together but Ray "
                f"has {total_cpus:g}; use placement=colocated or shrink the pools"
            )


def plan_placement(
    cfg: TrainConfig, roles: Roles, node_gpus: list[float] | None = None
) -> Placement:
    """Per-actor Ray requests for each pool (call ``check_fits`` first). GPU pools are bound
    to placement-group slots, created when their first actor starts (``node_gpus``: the
    cluster's GPUs per node; default: the connected Ray's, where it is up);
    ``Placement.release`` removes them."""
    pools = {p.name: p for p in pool_specs(cfg, roles)}
    share = _share(cfg, list(pools.values()))
    if node_gpus is None and any(p.gpus > 0 for p in pools.values()):
        node_gpus = connected_node_gpus()
    specs = slot_specs(cfg, list(pools.values()), node_gpus)
    slot_pools = {id(spec): SlotPool(spec) for spec in specs.values()}

    def resources(pool: PoolSpec) -> ActorResources:
        # custom resources pin a pool to node groups: asked for as given, never shared
        split = _split(pool, share)
        threads = max(1, int(pool.cpus))
        spec = specs.get(pool.name)
        if spec is None:
            return ActorResources(pool.cpus / split, 0.0, threads, dict(pool.resources))
        user = next(u for u in spec.users if u.pool == pool.name)
        binding = GpuBinding(slot_pools[id(spec)], user.per_actor)
        return ActorResources(user.cpus, user.fraction, threads, dict(pool.resources), binding)

    return Placement(
        learner=resources(pools["learner"]),
        rollout=resources(pools["rollout"]),
        reference=resources(pools["reference"]) if roles.reference else None,
        critic=resources(pools["critic"]) if roles.critic else None,
        reward=resources(pools["reward"]) if "reward" in pools else None,
        reward_model=resources(pools["reward_model"]) if "reward_model" in pools else None,
        judge=resources(pools["judge"]) if "judge" in pools else None,
        slot_pools=tuple(slot_pools.values()),
    )
