"""GPU slots: Ray placement groups that bind every GPU actor to whole GPUs of its own.

Each GPU a run uses is a *slot*: one placement-group bundle ``{"GPU": 1, "CPU": ...}``. Where
engines span k > 1 GPUs, slots come in groups of k, each group a placement group on one node
(``STRICT_PACK``); otherwise the configured slots form one placement group packed onto as few
nodes as Ray can (``PACK``: ranks stay close). An actor is scheduled into its first slot's
bundle and asks for a share of that bundle's GPU, so Ray hands it exactly that GPU: Ray reserves
a physical GPU per bundle, and best-fit packing of fractional requests can no longer put two
ranks of one NCCL group on one device.

Colocated GPU pools share one slot pool: learner rank i, reference rank i and critic rank i
take slot i, and rollout engine j takes slots ``[j*k, (j+1)*k)`` (k: its tensor-parallel size),
so learner rank i shares its GPU with exactly one engine shard. Each time-shared pool asks
``1/S`` of a slot's GPU (S: how many time-shared pools have GPUs), which sums to one GPU.
Disaggregated pools, and reward models, get slot pools of their own and ask for whole GPUs.

An engine over k GPUs is one actor in one bundle; the GPUs of its other k-1 bundles are read
off the bundles themselves (a tiny probe task in each, once per group) and handed to the actor,
which sets ``CUDA_VISIBLE_DEVICES`` to them before CUDA starts (``bind_visible_devices``), as its
tensor-parallel worker processes inherit it.

``SlotPoolSpec`` and the layout are plain data (``rlsys.placement.resources`` builds them and
checks they fit); ``SlotPool`` creates the placement groups, lazily, the first time an actor
needs one.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass, field, replace

log = logging.getLogger(__name__)

PLACEMENT_WAIT_S = 30.0  # log what is pending if a placement group is not placed by then


@dataclass(frozen=True)
class SlotUser:
    """One pool's actors in a slot pool: each holds ``per_actor`` consecutive slots and asks
    Ray for ``fraction`` of its first slot's GPU and ``cpus`` CPUs (plus ``resources``).
    ``most``: the most actors the pool can grow to mid-run (an elastic schedule, autoscaling),
    whose CPUs the bundles hold room for where they would start."""

    pool: str
    count: int
    per_actor: int
    fraction: float
    cpus: float
    resources: dict[str, float] = field(default_factory=dict)
    most: int = 0  # 0: count

    def starts_at(self, slot: int, region: int) -> bool:
        """Whether one of this pool's actors can have ``slot`` as its first slot: within the
        configured ``region``, where its actors start at their largest size; beyond it (a
        pool grown past every configured size), wherever the pattern continues."""
        if slot % self.per_actor:
            return False
        return slot >= region or slot // self.per_actor < max(self.count, self.most)


@dataclass(frozen=True)
class SlotPoolSpec:
    """A set of GPU slots and the pools whose actors take them, in placement groups.

    The configured *region* holds the slots the configured pool sizes need, rounded up to
    whole engines. With engines over ``tp`` > 1 GPUs it is cut into groups of ``width`` slots
    (as many engines as one node holds), each on one node (STRICT_PACK); otherwise it is one
    group packed onto as few nodes as Ray can (PACK, so ranks stay close). Slots beyond the
    region (a pool grown mid-run) come in groups of one engine (``tp`` slots) each."""

    name: str  # "colocated", or the pool's own name
    tp: int  # GPUs of the widest actor: a tensor-parallel engine's
    users: tuple[SlotUser, ...]
    node_gpus: int = 0  # GPUs of the smallest GPU node, where known: strict groups fill it

    @property
    def size(self) -> int:
        """Slots the configured pool sizes need."""
        return max(u.count * u.per_actor for u in self.users)

    @property
    def region(self) -> int:
        """The configured slots, in whole engines (an engine never straddles its end)."""
        return math.ceil(self.size / self.tp) * self.tp

    @property
    def strict(self) -> bool:
        """Whether each group must sit on one node (an engine's GPUs)."""
        return self.tp > 1

    @property
    def width(self) -> int:
        """Slots per configured group: strict, as many engines' worth as one node holds
        (ranks that share those engines' GPUs stay on one node); else the whole region."""
        if not self.strict:
            return self.region
        engines_per_node = max(1, self.node_gpus // self.tp)
        return self.tp * min(engines_per_node, self.region // self.tp)

    @property
    def num_groups(self) -> int:
        """Groups of the configured region."""
        return math.ceil(self.region / self.width)

    def group_of(self, slot: int) -> tuple[int, int]:
        """(group, bundle index in it) of ``slot``."""
        if slot < self.region:
            return divmod(slot, self.width)
        extra, bundle = divmod(slot - self.region, self.tp)
        return self.num_groups + extra, bundle

    def group_slots(self, group: int) -> range:
        """The slots of ``group`` (the region's last group may be narrower than ``width``)."""
        if group < self.num_groups:
            return range(group * self.width, min((group + 1) * self.width, self.region))
        first = self.region + (group - self.num_groups) * self.tp
        return range(first, first + self.tp)

    def bundle(self, slot: int) -> dict[str, float]:
        """Resources of slot ``slot``'s bundle: one GPU, and what the actors that can start
        there ask for."""
        out: dict[str, float] = {"GPU": 1.0}
        for user in self.users:
            if user.starts_at(slot, self.region):
                for name, amount in [("CPU", user.cpus), *user.resources.items()]:
                    out[name] = out.get(name, 0.0) + amount
        return {k: v for k, v in out.items() if v > 0}


class NoRoom(ValueError):
    """The slot groups do not fit the nodes (``assign_groups``)."""


def assign_groups(
    specs: list[SlotPoolSpec], node_gpus: list[float]
) -> dict[tuple[int, int], tuple[int, int]]:
    """Where each slot of the configured regions can go, ``{(spec index, slot): (node, GPU
    index on it)}``: a STRICT_PACK group's slots on one node, the others one by one, first-fit
    over the nodes in order (largest groups first), as a packing Ray could find. Raises
    ``NoRoom`` saying why none exists."""
    free = [int(g) for g in node_gpus]
    used = [0] * len(free)
    units = []  # (size, spec index, its slots)
    for i, spec in enumerate(specs):
        for group in range(spec.num_groups):
            slots = spec.group_slots(group)
            if spec.strict:
                units.append((len(slots), i, slots))
            else:
                units.extend((1, i, range(s, s + 1)) for s in slots)
    where = {}
    for size, i, slots in sorted(units, key=lambda u: -u[0]):
        node = next((n for n, room in enumerate(free) if room >= size), None)
        if node is None:
            sizes = sorted((u[0] for u in units if u[0] > 1), reverse=True)
            raise NoRoom(
                f"{sum(u[0] for u in units)} GPUs"
                + (f", in groups of {sizes} that must each sit on one node," if sizes else "")
                + f" do not fit nodes of {[int(g) for g in node_gpus]} GPUs"
                + (f" (none has {size})" if size > max(node_gpus, default=0) else "")
            )
        for k, slot in enumerate(slots):
            where[(i, slot)] = (node, used[node] + k)
        free[node] -= size
        used[node] += size
    return where


class SlotPool:
    """The placement groups of one ``SlotPoolSpec``, created as actors first need them and
    removed by ``remove``. Creating one never waits: an actor scheduled into a group that is
    not placed yet waits in Ray (as any actor waits for room), so a pool grown past the
    cluster's room times out where it waits for its actors."""

    def __init__(self, spec: SlotPoolSpec) -> None:
        self.spec = spec
        self._groups: dict[int, object] = {}  # group index -> PlacementGroup
        self._gpu_ids: dict[int, str] = {}  # slot -> its GPU's id, probed (strict groups)
        self._lock = threading.Lock()  # guards the dicts; never held while waiting

    def _group(self, group: int):
        with self._lock:
            if group not in self._groups:
                self._groups[group] = self._create(group)
            return self._groups[group]

    def _create(self, group: int):
        from ray.util.placement_group import placement_group

        bundles = [self.spec.bundle(s) for s in self.spec.group_slots(group)]
        return placement_group(
            bundles,
            strategy="STRICT_PACK" if self.spec.strict else "PACK",
            name=f"rlsys-{self.spec.name}-{group}-{os.getpid()}",
        )

    def groups(self) -> set[int]:
        """The groups created so far."""
        with self._lock:
            return set(self._groups)

    def strategy(self, slot: int):
        """The scheduling strategy of an actor whose first slot is ``slot`` (creates its
        group if needed; does not wait for it to be placed)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group, bundle = self.spec.group_of(slot)
        return PlacementGroupSchedulingStrategy(
            self._group(group), placement_group_bundle_index=bundle
        )

    def gpu_ids(self, slots: range, timeout_s: float | None = None, fresh: bool = False):
        """The GPU ids (as ``CUDA_VISIBLE_DEVICES`` names them) of ``slots``, which lie in one
        group, read off its bundles once it is placed (``timeout_s``: raise TimeoutError
        past it; None waits, logging what is pending). ``fresh``: read again (a group Ray
        placed anew after a node was lost)."""
        group = self.spec.group_of(slots[0])[0]
        pg = self._group(group)
        if fresh or any(s not in self._gpu_ids for s in slots):
            _wait_placed(pg, f"GPU slots {list(slots)} of {self.spec.name}", timeout_s)
            self._probe(pg, self.spec.group_slots(group))
        return [self._gpu_ids[s] for s in slots]

    def _probe(self, pg, slots: range) -> None:
        """Read each bundle's GPU id with a task that asks for a sliver of it."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        probe = ray.remote(num_cpus=0, num_gpus=0.0001)(_bundle_gpu_ids)
        refs = [
            probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, b)).remote()
            for b in range(len(slots))
        ]
        ids = ray.get(refs)
        with self._lock:
            for slot, got in zip(slots, ids, strict=True):
                self._gpu_ids[slot] = got[0]

    def remove(self, groups: set[int] | None = None) -> None:
        """Remove the placement groups ``groups`` (default: all; the actors in them must be
        gone)."""
        from ray.util.placement_group import remove_placement_group

        with self._lock:
            chosen = set(self._groups) if groups is None else groups & set(self._groups)
            removed = [self._groups.pop(g) for g in chosen]
            for g in chosen:
                for slot in self.spec.group_slots(g):
                    self._gpu_ids.pop(slot, None)
        for pg in removed:
            try:
                remove_placement_group(pg)
            except Exception as exc:  # noqa: BLE001 - Ray shut down already: nothing to free
                log.debug("placement group not removed: %s", exc)


def _wait_placed(pg, what: str, timeout_s: float | None) -> None:
    """Wait until ``pg`` is placed: at most ``timeout_s`` (then TimeoutError), or for ever,
    logging every ``PLACEMENT_WAIT_S`` what is pending."""
    import ray

    waited = 0.0
    while True:
        step = PLACEMENT_WAIT_S if timeout_s is None else max(0.0, timeout_s - waited)
        ready, _ = ray.wait([pg.ready()], timeout=step)
        if ready:
            return
        waited += step
        if timeout_s is not None:
            raise TimeoutError(f"{what} not placed within {timeout_s:.0f} s: no room for them")
        log.warning(
            "%s not placed after %.0f s; waiting for the cluster to offer them (autoscaling?); "
            "`ray status` shows what is free",
            what,
            waited,
        )


def _bundle_gpu_ids() -> list[str]:
    """Run inside a bundle: the GPU ids Ray gave it."""
    import ray

    return [str(i) for i in ray.get_gpu_ids()]


@dataclass(frozen=True)
class GpuBinding:
    """Where a pool's actors sit in a slot pool: actor ``i`` holds slots
    ``offset + i * per_actor`` onwards."""

    slots: SlotPool
    per_actor: int
    offset: int = 0

    def slot_range(self, index: int) -> range:
        """The slots of actor ``index``."""
        first = self.offset + index * self.per_actor
        return range(first, first + self.per_actor)

    def strategy(self, index: int):
        """The Ray scheduling strategy of actor ``index``: its first slot's bundle."""
        return self.slots.strategy(self.slot_range(index)[0])

    def visible_devices(
        self, index: int, timeout_s: float | None = None, fresh: bool = False
    ) -> str | None:
        """``CUDA_VISIBLE_DEVICES`` actor ``index`` must set for itself (an actor over several
        GPUs), or None where Ray's own setting (its bundle's GPU) is right
        (``SlotPool.gpu_ids`` for ``timeout_s`` and ``fresh``)."""
        if self.per_actor == 1:
            return None
        return ",".join(self.slots.gpu_ids(self.slot_range(index), timeout_s, fresh))

    def shifted(self, actors: int) -> GpuBinding:
        """The binding of a pool that continues ``actors`` actors further on (a reward
        model's second group of ranks)."""
        return replace(self, offset=self.offset + actors * self.per_actor)


def bind_visible_devices(visible: str | None) -> None:
    """In an actor, before CUDA starts: see only ``visible`` (an engine over several GPUs);
    None keeps what Ray set."""
    if visible is None:
        return
    import sys

    if "torch" in sys.modules and sys.modules["torch"].cuda.is_initialized():
        raise RuntimeError(
            "CUDA started before the actor's GPUs were bound; bind_visible_devices must run "
            "first in the actor"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = visible


def device_report(device: str) -> dict:
    """What an actor was given and uses: Ray's GPU ids, ``CUDA_VISIBLE_DEVICES``, the device
    it selected, and the physical GPU that device is (None on CPU)."""
    import ray

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [v for v in (visible or "").split(",") if v]
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "gpu_ids": [str(i) for i in ray.get_gpu_ids()],
        "cuda_visible_devices": visible,
        "device": device,
        "physical_gpus": names,  # local index i is names[i]; device cuda:0 is names[0]
    }
