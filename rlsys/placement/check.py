"""Place a run's actors on the connected Ray cluster, as the run would, and check the GPU layout.

Every actor of every pool is started as a stand-in (``_Stand``, no model) with the options the
pools give the real one (``ActorResources.actor_options``: the same CPU and GPU requests, the
same placement-group slots) and binds the same devices (``bind_visible_devices``); each reports
the GPUs Ray gave it and those it sees. Ray's scheduler is the real one, so on a CPU machine
with logical GPUs (``ray.init(num_gpus=8)``, ``ray start --num-gpus=4`` per node) this shows
where a GPU cluster would put each actor. ``violations`` then checks what a GPU needs:

* no two ranks of one NCCL group (learner, critic, reference, each reward model) on one GPU;
* an engine over k GPUs sees k distinct GPUs of its own node;
* colocated: learner rank i's GPU is the GPU of engine shard i (and reference / critic rank i
  share it too);
* no GPU shared by actors that are not meant to share it (disaggregated pools, reward models);
* every actor's own Ray-assigned GPU is the first one it sees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import ray

from rlsys.config.schema import TrainConfig
from rlsys.placement.gpu_slots import assign_groups
from rlsys.placement.resources import (
    Placement,
    Roles,
    connected_node_gpus,
    plan_placement,
    pool_specs,
    slot_specs,
    unique_specs,
)

# pools that time-share GPUs when colocated (rlsys.placement.resources.TIME_SHARED), in rank order
SHARING = ("learner", "reference", "critic")


@ray.remote
class _Stand:
    """A stand-in for a pool's actor: binds the devices the real one would, reports them."""

    def __init__(self, visible: str | None) -> None:
        from rlsys.placement.gpu_slots import bind_visible_devices

        bind_visible_devices(visible)

    def report(self) -> dict:
        from rlsys.placement.gpu_slots import device_report

        return device_report("cuda")


@dataclass(frozen=True)
class Placed:
    """Where one actor landed."""

    pool: str
    index: int
    node_id: str
    gpu_ids: tuple[str, ...]  # what Ray assigned it (its bundle's GPU)
    visible: tuple[str, ...]  # the GPUs it sees (CUDA_VISIBLE_DEVICES), device 0 first
    gpus_asked: float  # its share of its first slot's GPU

    @property
    def gpus(self) -> list[tuple[str, str]]:
        """The (node, GPU) pairs it uses."""
        return [(self.node_id, g) for g in self.visible]


def _resources(placement: Placement, pool: str):
    return getattr(placement, pool)


def place(
    cfg: TrainConfig, roles: Roles | None = None, timeout_s: float = 120.0, grow: bool = True
) -> list[Placed]:
    """Start a stand-in for every actor of ``cfg``'s pools in its slots (``grow``: as many as
    each pool can grow to mid-run, ``placement.most_actors``), read where each landed, stop
    them and remove the placement groups. GPU pools only (CPU actors have no layout to
    check). Raises TimeoutError naming the actors Ray could not place within ``timeout_s``."""
    roles = roles or Roles.for_rl(cfg)
    placement = plan_placement(cfg, roles)
    started: list[tuple[str, int, float, object]] = []
    try:
        for spec in pool_specs(cfg, roles):
            res = _resources(placement, spec.name)
            if res is None or res.gpus is None:
                continue
            for index in range(max(spec.count, spec.most) if grow else spec.count):
                options = res.actor_options(index)
                options.pop("runtime_env", None)  # thread settings: nothing to run here
                visible = res.visible_devices(index, timeout_s)
                actor = _Stand.options(**options).remote(visible)
                started.append((spec.name, index, res.num_gpus, actor))
        refs = [a.report.remote() for *_, a in started]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            missing = [
                f"{p} {i}" for (p, i, _, _), r in zip(started, refs, strict=True) if r not in ready
            ]
            raise TimeoutError(
                f"Ray placed no room for {', '.join(missing)} within {timeout_s:.0f} s"
            )
        reports = ray.get(refs)
    finally:
        for *_, actor in started:
            ray.kill(actor)
        placement.release()
    return [
        Placed(
            pool,
            index,
            r["node_id"],
            tuple(r["gpu_ids"]),
            tuple(r["physical_gpus"]),
            asked,
        )
        for (pool, index, asked, _), r in zip(started, reports, strict=True)
    ]


def predict(cfg: TrainConfig, node_gpus: list[float], roles: Roles | None = None) -> list[Placed]:
    """Where the actors would land on nodes of ``node_gpus`` GPUs, without Ray: the slot
    layout itself (``rlsys.placement.resources.slot_specs``), its groups packed onto the nodes as
    ``check_fits`` packs them (Ray may choose other nodes; the layout's properties hold on
    any). Nodes are named ``node0``...; GPU ids count from 0 on each. Raises
    ``gpu_slots.NoRoom`` where the groups do not fit."""
    roles = roles or Roles.for_rl(cfg)
    pools = pool_specs(cfg, roles)
    by_pool = slot_specs(cfg, pools, node_gpus)
    specs = unique_specs(by_pool)
    where = assign_groups(specs, node_gpus)
    index_of = {id(spec): i for i, spec in enumerate(specs)}
    placed = []
    for pool in pools:
        spec = by_pool.get(pool.name)
        if spec is None:
            continue
        user = next(u for u in spec.users if u.pool == pool.name)
        for index in range(pool.count):
            slots = range(index * user.per_actor, (index + 1) * user.per_actor)
            spots = [where[(index_of[id(spec)], s)] for s in slots]
            node = f"node{spots[0][0]}"
            gpus = tuple(str(gpu) for _, gpu in spots)
            placed.append(Placed(pool.name, index, node, gpus[:1], gpus, user.fraction))
    return placed


def violations(cfg: TrainConfig, placed: list[Placed]) -> list[str]:
    """What in ``placed`` a GPU cluster could not run (empty: the layout is sound)."""
    problems: list[str] = []
    by_pool: dict[str, list[Placed]] = {}
    for p in placed:
        by_pool.setdefault(p.pool, []).append(p)
    for actors in by_pool.values():
        actors.sort(key=lambda p: p.index)
    per_actor = _per_actor_gpus(cfg)
    for p in placed:
        want = per_actor[p.pool]
        if len(p.visible) != want or len(set(p.visible)) != want:
            problems.append(
                f"{p.pool} {p.index} sees GPUs {list(p.visible)}, not {want} of its own"
            )
        if not p.gpu_ids or not p.visible or p.gpu_ids[0] != p.visible[0]:
            problems.append(
                f"{p.pool} {p.index}: Ray gave it GPU {list(p.gpu_ids)} but its device 0 is "
                f"{p.visible[:1]}"
            )
    for name, groups in _nccl_groups(cfg, by_pool).items():
        for ranks in groups:
            used = [g for r in ranks for g in r.gpus]
            if len(used) != len(set(used)):
                problems.append(f"two {name} ranks share a GPU: {[r.gpus for r in ranks]}")
    colocated = cfg.placement.mode == "colocated"
    engines = by_pool.get("rollout", [])
    if colocated and engines:
        shards = [g for e in engines for g in e.gpus]  # engine shard i on shards[i]
        for name in SHARING:
            for rank in by_pool.get(name, []):
                if rank.index < len(shards) and rank.gpus[0] != shards[rank.index]:
                    problems.append(
                        f"colocated {name} rank {rank.index} is on {rank.gpus[0]} but engine "
                        f"shard {rank.index} on {shards[rank.index]}"
                    )
    owners: dict[tuple[str, str], set[str]] = {}
    for p in placed:
        family = "colocated" if colocated and p.pool in (*SHARING, "rollout") else p.pool
        for gpu in p.gpus:
            owners.setdefault(gpu, set()).add(family)
    for gpu, families in owners.items():
        if len(families) > 1:
            problems.append(f"GPU {gpu} is shared by {sorted(families)}, which do not time-share")
    return problems


def _per_actor_gpus(cfg: TrainConfig) -> dict[str, int]:
    return {
        "learner": int(cfg.learner.num_gpus_per_rank),
        "rollout": int(cfg.rollout.num_gpus_per_worker),
        "reference": int(cfg.reference.num_gpus),
        "critic": int(cfg.critic.num_gpus_per_rank),
        "reward_model": int(cfg.reward.model.num_gpus),
    }


def _nccl_groups(cfg: TrainConfig, by_pool: dict[str, list[Placed]]) -> dict:
    """The process groups whose ranks must each have a GPU of their own."""
    groups = {name: [by_pool[name]] for name in SHARING if name in by_pool}
    models = by_pool.get("reward_model", [])
    size = cfg.reward.model.world_size
    if models:
        groups["reward model"] = [models[i : i + size] for i in range(0, len(models), size)]
    return groups


def check_cases(
    cases: list[list[str]], node_gpus: list[float] | None = None, timeout_s: float = 120.0
) -> list[dict]:
    """For each list of overrides: load and validate the config, check it fits the connected
    cluster (``check_fits``, as a run does before any actor starts), place it (``place``, its
    pools at their largest elastic sizes) and check the layout. A config the checks refuse,
    or whose actors Ray cannot place within ``timeout_s``, is reported with the error."""
    from rlsys.config.errors import ConfigError
    from rlsys.placement.resources import check_fits
    from rlsys.resolve import load_config

    resources = ray.cluster_resources()
    nodes = node_gpus if node_gpus is not None else connected_node_gpus()
    out = []
    for overrides in cases:
        record: dict = {"overrides": overrides, "error": None, "placed": [], "violations": []}
        try:
            cfg = load_config(overrides)
            roles = Roles.for_rl(cfg)
            check_fits(
                cfg, resources.get("CPU", 0), resources.get("GPU", 0), roles, resources, nodes
            )
        except ConfigError as exc:
            record["error"] = str(exc)
            out.append(record)
            continue
        try:
            placed = place(cfg, roles, timeout_s)
        except TimeoutError as exc:
            record["error"] = str(exc)
            out.append(record)
            continue
        record["placed"] = [vars(p) | {"visible": list(p.visible)} for p in placed]
        record["violations"] = violations(cfg, placed)
        out.append(record)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m rlsys.placement.check [--address ADDR] [--cases FILE] [key=value ...]``:
    place a config's actors (or each case of a JSON file of override lists) on a Ray
    cluster with stand-ins and print where each landed and what a GPU could not run."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m rlsys.placement.check", description=__doc__)
    parser.add_argument("--address", default="auto", help="the Ray cluster (default: auto)")
    parser.add_argument("--cases", help="a JSON file: a list of override lists")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    cases = json.loads(Path(args.cases).read_text()) if args.cases else [args.overrides]
    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    try:
        records = check_cases(cases)
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps(records))
    for r in records if not args.json else []:
        print(" ".join(r["overrides"]) or "(defaults)")
        if r["error"]:
            print(f"  refused: {r['error']}")
            continue
        for p in r["placed"]:
            print(f"  {p['pool']} {p['index']}: node {p['node_id'][:8]} GPUs {p['visible']}")
        print("  " + ("; ".join(r["violations"]) or "layout sound"))
    bad = [r for r in records if r["violations"]]
    return 1 if bad else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
