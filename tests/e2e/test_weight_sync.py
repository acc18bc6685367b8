"""After every weight sync, each rollout engine's greedy output equals the learner's.

Runs every engine x CPU transport pairing that matters: both engines on the object store,
vLLM on the collective transport over both CPU data planes, the HF engine on the zero-copy
shared-memory plane (its weights are views of the slots), with 1 and 2 learner ranks.
"""

from __future__ import annotations

import pytest
from sync_check import check_greedy_agreement

from rlsys.models.loading import load_model
from rlsys.placement.resources import Roles
from rlsys.resolve import load_config
from rlsys.workers.pools import start_pools

# CI covers each engine, transport and data plane once, and the tensor-parallel reshard; the
# 1-rank variants, and vLLM's full-weight collective sync to 2 engines (the TP case syncs full
# weights over the same plane, the HF case to 2 engines), run in the long tier.
LONG = pytest.mark.long
CASES = [  # engine, transport, CPU data plane, learner ranks, engines, engine TP size, LoRA rank
    pytest.param("hf", "object_store", "auto", 1, 2, 1, 0, marks=LONG),
    ("hf", "object_store", "auto", 2, 2, 1, 0),
    pytest.param("vllm", "object_store", "auto", 1, 2, 1, 0, marks=LONG),
    pytest.param("vllm", "collective", "shm", 2, 2, 1, 0, marks=LONG),
    pytest.param("vllm", "collective", "gloo", 1, 2, 1, 0, marks=LONG),
    pytest.param("hf", "collective", "gloo", 2, 2, 1, 0, marks=LONG),
    ("hf", "collective", "shm", 2, 2, 1, 0),  # zero-copy: the engines keep views of the slots
    ("vllm", "collective", "shm", 2, 1, 2, 0),  # 2 FSDP2 shards -> full tensors -> 2 TP shards
    # LoRA: only adapters travel; each engine merges them into its copy of the base
    ("vllm", "collective", "shm", 2, 2, 1, 8),
    pytest.param("hf", "object_store", "auto", 1, 1, 1, 8, marks=LONG),
]


@pytest.mark.parametrize(
    ("engine", "transport", "plane", "world_size", "engines", "tp", "lora"), CASES
)
def test_engines_match_learner_greedy_after_each_sync(
    ray_cpu, tiny_model_dir, engine, transport, plane, world_size, engines, tp, lora
):
    cfg = load_config(
        [
            f"model.lora.rank={lora}",
            *(["learner.optim.lr=3e-2"] if lora else []),  # adapters move the policy slower
            f"learner.world_size={world_size}",
            f"rollout.engine={engine}",
            f"rollout.num_workers={engines}",
            f"rollout.num_cpus_per_worker={2 // engines}",
            f"rollout.vllm.tensor_parallel_size={tp}",
            f"weight_sync.transport={transport}",
            f"weight_sync.cpu_data_plane={plane}",
            "weight_sync.bucket_mb=0.05",
        ]
    )
    pools = start_pools(cfg, tiny_model_dir, Roles())
    try:
        sent = check_greedy_agreement(cfg, pools, tiny_model_dir)
    finally:
        pools.shutdown()
    expected_plane = "object_store" if transport == "object_store" else plane
    if (engine, plane, lora) == ("hf", "shm", 0):
        expected_plane = "shm_resident"
    assert [s.data_plane for s in sent] == [expected_plane] * 3
    if lora:  # adapters only: a small fraction of the model's bytes
        model = load_model(tiny_model_dir)
        full_bytes = sum(t.numel() * t.element_size() for t in model.parameters())
        assert all(s.num_tensors == 2 * 7 * 2 for s in sent)  # A and B of 7 modules, 2 layers
        assert all(s.num_bytes < full_bytes / 4 for s in sent)
