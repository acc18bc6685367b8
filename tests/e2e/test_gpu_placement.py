"""GPU placement on a simulated cluster: two Ray nodes on loopback with 4 logical GPUs each.

Ray's real scheduler places every actor of each layout (``python -m rlsys.placement.check``:
stand-ins started with the pools' own options, placement-group slots and device binding), and
each reports the GPUs Ray gave it and the ones it sees. The layouts are the ones GPU users
start with (colocated learner and engines, tensor-parallel engines, PPO's critic and
reference, reward models, disaggregated pools); the checks are what NCCL and a GPU need
(``rlsys.placement.check.violations``), plus the layouts no cluster of this shape can hold,
refused before any actor starts with the key to change, and the commands ``rlsys plan`` prints
for this cluster, placed as printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from loopback import AUTH, LoopbackCluster, Node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
GPU = ["learner.num_gpus_per_rank=1", "rollout.num_gpus_per_worker=1"]
VLLM_TP = ["rollout.engine=vllm", "rollout.num_gpus_per_worker={k}"]
VLLM_TP.append("rollout.vllm.tensor_parallel_size={k}")


def tp(k: int) -> list[str]:
    return [item.format(k=k) for item in VLLM_TP]


# name -> overrides (every layout here fits 2 nodes x 4 GPUs)
LAYOUTS = {
    # the review's case: two learner ranks and two engines, one GPU each, colocated (the
    # fractional requests of old put both learner ranks on GPU 0)
    "colocated": [*GPU, "learner.world_size=2", "rollout.num_workers=2"],
    # colocated over both nodes: 8 learner ranks, two engines over 4 GPUs each
    "colocated_tp4": [*GPU, "learner.world_size=8", "rollout.num_workers=2", *tp(4)],
    # PPO: a critic and a reference group colocated with the learner, engines over 2 GPUs
    "ppo_tp2": [
        *GPU,
        "algorithm=ppo",
        "algorithm.kl_coef=0.01",
        "learner.world_size=4",
        "critic.world_size=4",
        "critic.num_gpus_per_rank=1",
        "reference.world_size=4",
        "reference.num_gpus=1",
        "rollout.num_workers=2",
        *tp(2),
    ],
    # disaggregated: 4 learner GPUs, two engines over 2 GPUs each
    "disaggregated": [
        *GPU,
        "placement=disaggregated",
        "weight_sync.transport=collective",
        "learner.world_size=4",
        "rollout.num_workers=2",
        *tp(2),
    ],
    # autoscaling adds a second engine onto learner rank 1's GPU (placed at its largest size)
    "colocated_autoscale": [
        *GPU,
        "learner.world_size=2",
        "rollout.elastic.autoscale.enabled=true",
        "rollout.elastic.autoscale.max_workers=2",
    ],
    # a learner resized 2 -> 4 ranks beside two TP-2 engines
    "colocated_learner_resize": [
        *GPU,
        "learner.world_size=2",
        "learner.elastic.schedule={5:4}",
        "rollout.num_workers=2",
        *tp(2),
    ],
    # two reward models of 2 ranks each on GPUs of their own, beside colocated pools
    "reward_models": [
        *GPU,
        "learner.world_size=2",
        "rollout.num_workers=2",
        "reward.model.paths=[rm_a,rm_b]",
        "reward.model.world_size=2",
        "reward.model.num_gpus=1",
    ],
}
# what `rlsys plan --cluster nodes=2,gpus_per_node=4,gpu=H100 --model qwen2.5-0.5b` prints,
# placed as printed
PLAN = ["--cluster", "nodes=2,gpus_per_node=4,gpu=H100", "--model", "qwen2.5-0.5b", "--top", "2"]


def _planned() -> dict[str, list[str]]:
    from rlsys.plan.search import plan_commands

    return {f"plan_{i}": overrides for i, overrides in enumerate(plan_commands(PLAN))}


LAYOUTS.update(_planned())
# name -> (overrides, the key the refusal must name)
REFUSED = {
    "tp8_on_4_gpu_nodes": ([*GPU, "learner.world_size=8", *tp(8)], "tensor_parallel_size"),
    "more_gpus_than_the_cluster": ([*GPU, "learner.world_size=12"], "learner.world_size=12"),
    "disaggregated_overflow": (
        [*GPU, "placement=disaggregated", "learner.world_size=6", "rollout.num_workers=3"],
        "placement.mode=colocated",
    ),
}


@pytest.fixture(scope="module")
def cluster():
    """Two loopback nodes of 4 logical GPUs (and plenty of logical CPUs) each."""
    started = LoopbackCluster(Node("head", cpus=32, gpus=4), [Node("gpu_node", cpus=32, gpus=4)])
    try:
        started.start()
        yield started
    finally:
        started.stop()


def _python(cluster, args: list[str], timeout: float) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**AUTH, "PYTHONPATH": pythonpath},
    )


@pytest.fixture(scope="module")
def placed(cluster, tmp_path_factory):
    """Every layout (each pool at its largest elastic size) and refusal, placed in one
    session of ``python -m rlsys.placement.check``."""
    cases = [*LAYOUTS.values(), *(overrides for overrides, _ in REFUSED.values())]
    path = tmp_path_factory.mktemp("placement") / "cases.json"
    path.write_text(json.dumps(cases))
    result = _python(
        cluster,
        ["-m", "rlsys.placement.check", "--address", cluster.gcs, "--cases", str(path), "--json"],
        timeout=400,
    )
    assert result.stdout.strip(), result.stderr[-3000:]
    records = json.loads(result.stdout.strip().splitlines()[-1])
    names = [*LAYOUTS, *REFUSED]
    return dict(zip(names, records, strict=True))


# A pool grown past the cluster's room: creating its placement group does not wait, the wait
# for its GPUs times out, and the groups are removed at once (this hung the run before).
NO_ROOM = """
import sys, time, ray
from rlsys.placement.gpu_slots import SlotPool, SlotPoolSpec, SlotUser
ray.init(address=sys.argv[1], logging_level="ERROR")
pool = SlotPool(SlotPoolSpec("engines", 2, (SlotUser("rollout", 4, 2, 1.0, 0.1),), 4))
assert pool.gpu_ids(range(0, 2), timeout_s=60) and pool.gpu_ids(range(4, 6), timeout_s=60)
start = time.perf_counter()
pool.strategy(8)  # a fifth engine: its group is made, not waited for
assert time.perf_counter() - start < 5, "made a group and waited"
try:
    pool.gpu_ids(range(8, 10), timeout_s=3)
    raise SystemExit("a group with no room reported GPUs")
except TimeoutError as exc:
    print("timed out:", exc)
start = time.perf_counter()
pool.remove()
assert time.perf_counter() - start < 5, "remove waited"
print("ok")
"""


def test_a_pool_grown_past_the_room_times_out_instead_of_hanging(cluster):
    result = _python(cluster, ["-c", NO_ROOM, cluster.gcs], timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    assert "not placed within 3 s: no room" in result.stdout


def test_the_plan_prints_commands_for_this_cluster():
    assert [name for name in LAYOUTS if name.startswith("plan_")] == ["plan_0", "plan_1"]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_places_every_rank_on_a_gpu_of_its_own(placed, name):
    record = placed[name]
    assert record["error"] is None, record["error"]
    assert record["violations"] == [], record["violations"]
    by_pool: dict[str, list[dict]] = {}
    for actor in record["placed"]:
        by_pool.setdefault(actor["pool"], []).append(actor)
    for pool, actors in by_pool.items():
        # every actor holds whole GPUs, and its Ray-assigned GPU is its device 0
        for a in actors:
            assert a["visible"] and a["gpu_ids"][0] == a["visible"][0], (pool, a)
    # a layout of at most one node's GPUs stays on one node (placement groups pack it)
    gpus = {(a["node_id"], g) for a in record["placed"] for g in a["visible"]}
    if len(gpus) <= 4:
        assert len({node for node, _ in gpus}) == 1, (name, gpus)


def test_colocated_learner_ranks_share_only_with_their_engine(placed):
    actors = placed["colocated"]["placed"]
    learners = sorted((a for a in actors if a["pool"] == "learner"), key=lambda a: a["index"])
    engines = sorted((a for a in actors if a["pool"] == "rollout"), key=lambda a: a["index"])
    gpu = [(a["node_id"], a["visible"][0]) for a in learners]
    assert len(set(gpu)) == 2  # the review found both ranks on GPU 0
    assert gpu == [(e["node_id"], e["visible"][0]) for e in engines]
    assert {a["gpus_asked"] for a in actors} == {0.5}  # two pools share each GPU


def test_pools_are_placed_at_the_sizes_they_grow_to(placed):
    """The grown actors start too: each bundle held room for them (a grown engine on a
    learner rank's GPU found no CPU reserved there before)."""
    counts = {}
    for name in ("colocated_autoscale", "colocated_learner_resize"):
        for actor in placed[name]["placed"]:
            counts[(name, actor["pool"])] = counts.get((name, actor["pool"]), 0) + 1
    assert counts[("colocated_autoscale", "rollout")] == 2
    assert counts[("colocated_learner_resize", "learner")] == 4


def test_tensor_parallel_engines_hold_whole_gpus_of_one_node(placed):
    engines = [a for a in placed["colocated_tp4"]["placed"] if a["pool"] == "rollout"]
    assert len(engines) == 2
    for engine in engines:
        assert sorted(engine["visible"]) == ["0", "1", "2", "3"], engine
    assert len({e["node_id"] for e in engines}) == 2  # one engine per node


@pytest.mark.parametrize("name", list(REFUSED))
def test_impossible_layouts_are_refused_naming_the_key(placed, name):
    record = placed[name]
    assert record["placed"] == [], "refused layouts start no actor"
    assert record["error"] is not None and REFUSED[name][1] in record["error"], record["error"]
