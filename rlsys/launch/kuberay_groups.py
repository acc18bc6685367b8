"""KubeRay worker groups of a run: which pools each group hosts and how big its pods are.

placement.mode=disaggregated gives the rollout pool a group of its own and the learner-side
pools (learner, critic, reference: the actors placement.learner_resources pins) another;
colocated pools time-share devices, so they share one group, which must also hold each pool
alone at full size. A pod offers what the Ray actors placed on it ask for (``plan_placement``,
colocated shares included), and advertises the custom resources they ask for
(placement.*_resources), so pinned pools land on their own group. Sizes the user sets
(launcher.kuberay.<group>.replicas/cpus/gpus) are kept and checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlsys.config.errors import ConfigError
from rlsys.config.kuberay import WorkerGroupConfig, quantity_bytes
from rlsys.config.schema import TrainConfig
from rlsys.placement.resources import (
    TIME_SHARED,
    ActorResources,
    Roles,
    check_fits,
    plan_placement,
    pool_specs,
)

# Memory of a pod's processes when launcher.kuberay.<group>.memory is null: per CPU, plus per
# GPU for the host copy of the weights a GPU engine or learner loads. /dev/shm comes on top.
GIB_PER_CPU = 4
GIB_PER_GPU = 16
GIB = 1024**3
MIB = 1024**2
_EPS = 1e-9  # float slack: 3 x 0.1 CPUs fit 0.3


@dataclass(frozen=True)
class HostedPool:
    """A pool whose actors a worker group hosts."""

    name: str
    count: int
    actor: ActorResources  # what each of its actors asks Ray for (a colocated share)
    cpus: float  # what each actor is configured with: the pool alone needs count x this
    gpus: float
    count_key: str  # the config key that sets count


@dataclass(frozen=True)
class GroupShape:
    """A worker group's pods: how many, how big, and what they advertise to Ray."""

    name: str  # groupName
    key: str  # its config, e.g. launcher.kuberay.rollout
    replicas: int
    cpus: int  # per pod: Kubernetes request = limit and Ray's num-cpus
    gpus: int  # per pod
    memory: str  # per pod (Kubernetes quantity), /dev/shm included
    shm: str  # per pod: sizeLimit of the memory-backed /dev/shm
    custom: dict[str, float]  # custom Ray resources per pod (rayStartParams.resources)
    slots: dict[str, int]  # actors of each hosted pool one pod takes
    config: WorkerGroupConfig  # node selector, tolerations


def hosted_pools(cfg: TrainConfig) -> dict[str, list[HostedPool]]:
    """The pools each worker group hosts, by group name, in render order."""
    roles = Roles.for_rl(cfg)
    plan = plan_placement(cfg, roles)
    hosted = [
        HostedPool(p.name, p.count, getattr(plan, p.name), p.cpus, p.gpus, p.count_key)
        for p in pool_specs(cfg, roles)
    ]
    if cfg.placement.mode == "colocated":
        return {"workers": hosted}
    return {
        "rollout": [p for p in hosted if p.name == "rollout"],
        "learner": [p for p in hosted if p.name != "rollout"],  # learner, critic, reference
    }


def _per_pod(
    pools: list[HostedPool], replicas: int, colocated: bool
) -> tuple[dict[str, int], float, float]:
    """Actors of each pool on one of ``replicas`` pods, and the CPUs and GPUs a pod needs: what
    its actors ask for, and its part of the largest pool's own need (colocated pools take
    turns on the same devices, so the group must hold each pool alone at full size)."""
    slots = {p.name: math.ceil(p.count / replicas) for p in pools}
    cpus = sum(slots[p.name] * p.actor.num_cpus for p in pools)
    # GPU actors hold whole GPUs (rlsys.placement.gpu_slots): the configured count per actor,
    # not the share of its first GPU it asks Ray for; colocated pools take turns on theirs
    whole = [slots[p.name] * p.gpus for p in pools if p.name in TIME_SHARED]
    gpus = sum(slots[p.name] * p.gpus for p in pools if p.name not in TIME_SHARED)
    if whole:
        gpus += max(whole) if colocated else sum(whole)
    if len(pools) > 1:
        cpus = max(cpus, max(p.count * p.cpus for p in pools) / replicas)
        gpus = max(gpus, max(p.count * p.gpus for p in pools) / replicas)
    return slots, cpus, gpus


def _describe(pools: list[HostedPool]) -> str:
    return ", ".join(f"{p.count_key}={p.count} x ({p.cpus:g} CPUs, {p.gpus:g} GPUs)" for p in pools)


def _show(value: int | None) -> str:
    return "null" if value is None else str(value)


def _mebibytes(size: int) -> str:
    """``size`` bytes as a quantity, rounded up to a whole Mi (Gi when exact)."""
    mib = -(-size // MIB)
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def pod_memory(memory: str | None, shm: str | None, processes: int) -> tuple[str, str]:
    """A pod's memory and /dev/shm, the user's where set. /dev/shm is tmpfs charged to the
    pod's memory, so a null memory is the ``processes`` bytes plus /dev/shm, and a null
    /dev/shm a third of memory (Ray's object store takes 30% of it and stays in /dev/shm only
    if it fits there); both null, /dev/shm is half of ``processes``."""
    if memory is not None:
        return memory, shm or _mebibytes(-(-quantity_bytes(memory) // 3))
    shm_bytes = quantity_bytes(shm) if shm else processes // 2
    return _mebibytes(processes + shm_bytes), shm or _mebibytes(shm_bytes)


def size_group(
    name: str, key: str, group: WorkerGroupConfig, pools: list[HostedPool]
) -> GroupShape:
    """Pods of worker group ``name`` that hold ``pools``: the user's replicas/cpus/gpus where
    set, else the fewest pods that fit them, else one actor of each pool per pod."""
    most = max(p.count for p in pools)
    if group.replicas is not None:
        tries = [group.replicas]
    elif group.cpus is None and group.gpus is None:
        tries = [most]
    else:
        tries = range(1, most + 1)
    for replicas in tries:
        slots, cpus, gpus = _per_pod(pools, replicas, name == "workers")
        if (group.cpus is None or cpus <= group.cpus + _EPS) and (
            group.gpus is None or gpus <= group.gpus + _EPS
        ):
            break
    else:
        given = f"{key}.cpus={_show(group.cpus)} and {key}.gpus={_show(group.gpus)}"
        if group.replicas is not None:
            raise ConfigError(
                f"{key}.replicas={group.replicas} pods of {given} cannot hold "
                f"{_describe(pools)}: each pod would need {cpus:g} CPUs and {gpus:g} GPUs; "
                f"raise {key}.replicas, {key}.cpus or {key}.gpus (null sizes them from the pools)"
            )
        raise ConfigError(
            f"pods of {given} cannot hold {_describe(pools)}, even one actor of each per pod "
            f"({cpus:g} CPUs, {gpus:g} GPUs); raise {key}.cpus / {key}.gpus (null sizes them "
            "from the pools) or give each actor less"
        )
    custom: dict[str, float] = {}
    for pool in pools:
        for resource, amount in pool.actor.resources.items():
            custom[resource] = custom.get(resource, 0.0) + slots[pool.name] * amount
    pod_cpus = group.cpus if group.cpus is not None else max(1, math.ceil(cpus - _EPS))
    pod_gpus = group.gpus if group.gpus is not None else math.ceil(gpus - _EPS)
    processes = (GIB_PER_CPU * pod_cpus + GIB_PER_GPU * pod_gpus) * GIB
    memory, shm = pod_memory(group.memory, group.shm_size, processes)
    return GroupShape(
        name=name,
        key=key,
        replicas=replicas,
        cpus=pod_cpus,
        gpus=pod_gpus,
        memory=memory,
        shm=shm,
        custom=custom,
        slots=slots,
        config=group,
    )


def worker_groups(cfg: TrainConfig) -> list[GroupShape]:
    """Every worker group of the run, sized; fails naming the keys when the pools cannot fit
    or a group's settings would be ignored by this placement mode."""
    kuberay = cfg.launcher.kuberay
    groups = hosted_pools(cfg)
    for unused in ("rollout", "learner", "workers"):
        if unused not in groups and getattr(kuberay, unused) != WorkerGroupConfig():
            used = " and ".join(f"launcher.kuberay.{g}" for g in groups)
            other = "colocated" if cfg.placement.mode == "disaggregated" else "disaggregated"
            raise ConfigError(
                f"launcher.kuberay.{unused} is set but placement.mode={cfg.placement.mode} "
                f"renders {used} only; move the settings there or use placement={other}"
            )
    shapes = [
        size_group(name, f"launcher.kuberay.{name}", getattr(kuberay, name), pools)
        for name, pools in groups.items()
    ]
    # the run's own start-up check, on the cluster these groups make (head: no CPUs)
    custom: dict[str, float] = {}
    for shape in shapes:
        for resource, amount in shape.custom.items():
            custom[resource] = custom.get(resource, 0.0) + shape.replicas * amount
    cpus = sum(s.replicas * s.cpus for s in shapes)
    gpus = sum(s.replicas * s.gpus for s in shapes)
    pods = [s.gpus for s in shapes for _ in range(s.replicas)]  # an engine's GPUs: one pod
    try:
        check_fits(cfg, cpus, gpus, Roles.for_rl(cfg), custom, pods)
    except ConfigError as exc:
        keys = " / ".join(f"{s.key}.replicas/cpus/gpus" for s in shapes)
        raise ConfigError(f"the worker groups ({keys}) are too small for the run: {exc}") from exc
    return shapes
