"""GPU slots without Ray: the placement-group layout of every preset on GPU clusters, the
bundles it asks for, the layouts refused before any actor starts, and the GPU config checks.
(tests/e2e/test_gpu_placement.py places the same layouts with Ray's scheduler.)"""

from __future__ import annotations

import pytest
import torch

from rlsys.config import ConfigError
from rlsys.config.loader import conf_dir
from rlsys.models.lora import AdapterMerger, merge
from rlsys.placement.check import Placed, predict, violations
from rlsys.placement.gpu_slots import NoRoom, assign_groups
from rlsys.placement.resources import (
    Roles,
    check_fits,
    plan_placement,
    pool_specs,
    slot_specs,
)
from rlsys.resolve import load_config

GPU = ["learner.num_gpus_per_rank=1", "rollout.num_gpus_per_worker=1"]


def tp(k: int) -> list[str]:
    return [
        "rollout.engine=vllm",
        f"rollout.num_gpus_per_worker={k}",
        f"rollout.vllm.tensor_parallel_size={k}",
    ]


def _presets() -> list[str]:
    return sorted(
        f"{group.name}={path.stem}"
        for group in conf_dir().iterdir()
        if group.is_dir() and group.name != "launcher"
        for path in group.glob("*.yaml")
    )


NEEDS = {"algorithm=gigpo": ["task=calculator_tool"]}  # as in test_config
ONE_GPU = {"learner": {"num_gpus_per_rank": 1}, "rollout": {"num_gpus_per_worker": 1}}
VLLM = {"engine": "vllm", "num_workers": 2}
# GPU layouts a preset can be run with on 8 GPUs, as nested field values (applied with
# dataclasses.replace, which re-runs every check: composing each pair with Hydra would cost
# a quarter second each)
LAYOUTS = {
    "colocated_2x1": {"learner": {"world_size": 2}, "rollout": {"num_workers": 2}},
    "colocated_tp4": {
        "learner": {"world_size": 8},
        "rollout": {**VLLM, "num_gpus_per_worker": 4, "vllm": {"tensor_parallel_size": 4}},
    },
    "disaggregated": {
        "placement": {"mode": "disaggregated", "engine_sleep": None},
        "weight_sync": {"transport": "collective"},
        "learner": {"world_size": 4},
        "rollout": {**VLLM, "num_gpus_per_worker": 2, "vllm": {"tensor_parallel_size": 2}},
    },
    "all_groups": {
        "learner": {"world_size": 4},
        "rollout": {"num_workers": 4},
        "critic": {"world_size": 4, "num_gpus_per_rank": 1},
        "reference": {"world_size": 4, "num_gpus": 1},
    },
}


def _with(obj, changes: dict):
    """``obj`` with nested ``changes`` (dicts for sub-configs), re-validated."""
    import dataclasses

    fields = {
        key: _with(getattr(obj, key), value) if isinstance(value, dict) else value
        for key, value in changes.items()
    }
    return dataclasses.replace(obj, **fields)


def _merge(*layouts: dict) -> dict:
    out: dict = {}
    for layout in layouts:
        for key, value in layout.items():
            out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize("preset", _presets())
def test_every_preset_lays_out_soundly_on_gpus(preset):
    """Each preset, run on each GPU layout, on one 8-GPU node and on two 4-GPU nodes: every
    rank on a GPU of its own, engines on whole GPUs of one node, colocated ranks on their
    engine shard's GPU (``violations``). A layout that does not fit is refused naming a key."""
    base = load_config([preset, *NEEDS.get(preset, [])])
    laid_out = 0
    for name, layout in LAYOUTS.items():
        try:
            cfg = _with(base, _merge(ONE_GPU, layout))
        except ConfigError as exc:  # a preset this layout does not combine with
            assert "=" in str(exc), (name, exc)
            continue
        for nodes in ([8], [4, 4]):
            roles = Roles.for_rl(cfg)
            try:
                check_fits(cfg, 1e6, sum(nodes), roles, node_gpus=nodes)
            except ConfigError as exc:
                assert preset == "placement=disaggregated", (name, nodes, exc)
                continue
            placed = predict(cfg, nodes, roles)
            assert placed, (name, nodes)
            assert violations(cfg, placed) == [], (name, nodes)
            laid_out += 1
    assert laid_out >= 4, "most layouts must apply to every preset"


def test_violations_catch_the_layouts_a_gpu_cannot_run():
    """The checker itself: ranks sharing a GPU, an engine shard away from its rank, a
    tensor-parallel engine across nodes."""
    cfg = load_config([*GPU, "learner.world_size=2", "rollout.num_workers=2"])
    good = predict(cfg, [4])
    assert violations(cfg, good) == []
    packed = [  # the fractional requests of old: both learner ranks on GPU 0
        Placed("learner", 0, "n", ("0",), ("0",), 0.5),
        Placed("learner", 1, "n", ("0",), ("0",), 0.5),
        Placed("rollout", 0, "n", ("1",), ("1",), 0.5),
        Placed("rollout", 1, "n", ("1",), ("1",), 0.5),
    ]
    found = " | ".join(violations(cfg, packed))
    assert "two learner ranks share a GPU" in found
    assert "colocated learner rank 0 is on ('n', '0') but engine shard 0 on ('n', '1')" in found
    tp_cfg = load_config([*GPU, "learner.world_size=2", *tp(2)])
    split = [
        Placed("learner", 0, "a", ("0",), ("0",), 0.5),
        Placed("learner", 1, "a", ("1",), ("1",), 0.5),
        Placed("rollout", 0, "a", ("0",), ("0", "0"), 0.5),  # one GPU seen twice
    ]
    assert any("not 2 of its own" in v for v in violations(tp_cfg, split))


def test_colocated_bundles_hold_a_gpu_and_the_cpus_of_the_actors_that_start_there():
    cfg = load_config([*GPU, "learner.world_size=8", "rollout.num_workers=2", *tp(4)])
    pools = pool_specs(cfg, Roles())
    by_pool = slot_specs(cfg, pools, [8])
    spec = by_pool["learner"]
    assert by_pool["rollout"] is spec and spec.name == "colocated"  # one shared slot pool
    assert spec.tp == 4 and spec.strict and spec.size == spec.region == 8 and spec.width == 8
    share = cfg.learner.num_cpus_per_rank / 2  # two colocated pools split the CPUs
    engine = cfg.rollout.num_cpus_per_worker / 2
    assert spec.bundle(0) == {"GPU": 1.0, "CPU": share + engine}  # rank 0 and engine 0
    assert spec.bundle(1) == {"GPU": 1.0, "CPU": share}  # rank 1 only
    assert spec.bundle(4) == {"GPU": 1.0, "CPU": share + engine}  # rank 4 and engine 1
    # on 4-GPU nodes the groups are one engine wide: 2 groups of 4 slots
    narrow = slot_specs(cfg, pools, [4, 4])["rollout"]
    assert narrow.width == 4 and narrow.num_groups == 2
    assert [narrow.group_of(s) for s in (0, 3, 4, 7)] == [(0, 0), (0, 3), (1, 0), (1, 3)]
    assert narrow.group_of(8) == (2, 0) and narrow.group_slots(2) == range(8, 12)  # grown
    placement = plan_placement(cfg, Roles(), node_gpus=[8])
    assert placement.learner.num_gpus == placement.rollout.num_gpus == 0.5
    assert placement.learner.gpus.slot_range(3) == range(3, 4)
    assert placement.rollout.gpus.slot_range(1) == range(4, 8)


def test_bundles_hold_room_for_the_actors_a_pool_grows_to():
    """A colocated engine that autoscaling adds lands on a learner rank's GPU: its bundle
    holds the engine's CPUs from the start (else the new engine never schedules)."""
    grows = [*GPU, "learner.world_size=2", "rollout.elastic.autoscale.enabled=true"]
    cfg = load_config([*grows, "rollout.elastic.autoscale.max_workers=2"])
    spec = slot_specs(cfg, pool_specs(cfg, Roles()))["rollout"]
    engine = cfg.rollout.num_cpus_per_worker / 2
    assert spec.size == 2 and spec.bundle(1)["CPU"] == cfg.learner.num_cpus_per_rank / 2 + engine
    fixed = load_config([*GPU, "learner.world_size=2"])
    spec = slot_specs(fixed, pool_specs(fixed, Roles()))["rollout"]
    assert spec.bundle(1)["CPU"] == fixed.learner.num_cpus_per_rank / 2  # no growth, no room
    # the learner's schedule likewise reserves for its largest size
    one = [*GPU, "rollout.num_workers=2", "learner.world_size=1"]
    resized = load_config([*one, "learner.elastic.schedule={5:2}"])
    engine = resized.rollout.num_cpus_per_worker / 2
    spec = slot_specs(resized, pool_specs(resized, Roles()))["learner"]
    assert spec.bundle(1)["CPU"] == resized.learner.num_cpus_per_rank / 2 + engine
    fixed = load_config(one)
    assert slot_specs(fixed, pool_specs(fixed, Roles()))["learner"].bundle(1)["CPU"] == engine


def test_the_last_group_holds_only_the_slots_the_pools_need():
    """Three engines over 2 GPUs each need 6 GPUs: on two 4-GPU nodes a group of 4 and one of
    2, not two of 4 (which would refuse a layout that fits)."""
    cfg = load_config(
        [*GPU, "placement=disaggregated", "learner.world_size=2", "rollout.num_workers=3", *tp(2)]
    )
    spec = slot_specs(cfg, pool_specs(cfg, Roles()), [4, 4])["rollout"]
    assert [spec.group_slots(g) for g in range(spec.num_groups)] == [range(4), range(4, 6)]
    check_fits(cfg, 64, 8, Roles(), node_gpus=[4, 4])  # 6 + 2 GPUs: exactly the cluster
    assert violations(cfg, predict(cfg, [4, 4])) == []
    # a region not a whole number of engines is rounded up to one (an engine never straddles)
    odd = load_config([*GPU, "learner.world_size=3", *tp(2)])
    assert slot_specs(odd, pool_specs(odd, Roles()))["learner"].region == 4


def test_single_gpu_actors_form_one_packed_group_and_grow_one_slot_at_a_time():
    cfg = load_config([*GPU, "learner.world_size=2", "rollout.num_workers=2"])
    spec = slot_specs(cfg, pool_specs(cfg, Roles()))["rollout"]
    assert not spec.strict and spec.num_groups == 1 and spec.group_slots(0) == range(2)
    assert spec.group_of(1) == (0, 1)
    assert spec.group_of(2) == (1, 0) and spec.group_slots(1) == range(2, 3)  # grown


def test_cpu_runs_keep_their_fractional_requests_and_no_placement_groups():
    placement = plan_placement(load_config([]), Roles())
    assert placement.learner.gpus is None and placement.slot_pools == ()
    assert "scheduling_strategy" not in placement.learner.actor_options()


def test_layouts_that_cannot_fit_are_refused_with_the_key_to_change():
    tp8 = load_config([*GPU, "learner.world_size=8", *tp(8)])
    check_fits(tp8, 64, 8, Roles(), node_gpus=[8])  # one 8-GPU node holds it
    with pytest.raises(ConfigError, match="rollout.vllm.tensor_parallel_size"):
        check_fits(tp8, 64, 8, Roles(), node_gpus=[4, 4])
    many = load_config([*GPU, "learner.world_size=12"])
    with pytest.raises(ConfigError, match=r"need 12 whole GPUs but Ray has 8.*learner.world_size"):
        check_fits(many, 64, 8, Roles())
    apart = load_config([*GPU, "placement=disaggregated", "learner.world_size=6"])
    with pytest.raises(ConfigError, match="placement.mode=colocated"):
        check_fits(apart, 64, 6, Roles())
    with pytest.raises(NoRoom, match="none has 8"):
        assign_groups(
            list({id(s): s for s in slot_specs(tp8, pool_specs(tp8, Roles())).values()}.values()),
            [4, 4],
        )


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["learner.num_gpus_per_rank=0.5"], "learner.num_gpus_per_rank=0.5: GPU actors hold whole"),
        (["learner.num_gpus_per_rank=2"], "a rank drives one GPU"),
        (["reference.num_gpus=0.25"], "reference.num_gpus=0.25"),
        (["rollout.num_gpus_per_worker=2"], "rollout.engine=hf: that engine runs on one GPU"),
        ([*GPU, "weight_sync.transport=collective"], "NCCL refuses two members"),
        ([*GPU, "rollout.num_workers=2", "weight_sync.transport=cuda_ipc"], "use one engine on one GPU"),
    ],
)  # fmt: skip
def test_gpu_configs_a_gpu_cannot_hold_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(overrides)


def test_gpu_transports_that_work_are_accepted():
    load_config([*GPU, "weight_sync.transport=cuda_ipc"])  # one engine on the learner's GPU
    load_config([*GPU, "rollout.num_workers=2", "learner.world_size=2"])  # object store
    load_config([*GPU, "placement=disaggregated", "weight_sync.transport=collective"])


def test_lora_merges_on_the_engine_device_whatever_device_the_adapters_come_on(tmp_path):
    """A GPU transport delivers adapters on the GPU while the base weights come from host
    memory: the merge moves all three to the engine's device. Here 'meta' plays the engine's
    device (this machine has one real device), so a CPU-only merge would fail."""
    base = torch.randn(6, 4)
    a, b = torch.randn(2, 4), torch.randn(6, 2)
    on_engine = merge(base, a.to("meta"), b, 0.5, device="meta")
    assert on_engine.device.type == "meta" and on_engine.dtype == base.dtype
    torch.testing.assert_close(merge(base, a, b, 0.5), base + 0.5 * b @ a)
    with pytest.raises(RuntimeError, match="not on the expected device"):  # the old merge
        base.float() + 0.5 * (b.to("meta").float() @ a.to("meta").float())
    from safetensors.torch import save_file

    save_file({"layer.weight": base}, str(tmp_path / "model.safetensors"))
    merger = AdapterMerger(str(tmp_path), "float32", 0.5, device="meta")
    bucket = {
        "layer.lora_A.weight": a.to("meta"),  # as a GPU transport delivers them
        "layer.lora_B.weight": b.to("meta"),
    }
    (full,) = list(merger([bucket]))
    assert full["layer.weight"].device.type == "meta"
    assert merger.base["layer.weight"].device.type == "cpu"  # the base stays on the host
