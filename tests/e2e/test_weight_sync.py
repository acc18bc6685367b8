"""After every weight sync, each rollout engine's greedy output equals the learner's.

Runs every engine x CPU transport pairing that matters: both engines on the object store,
vLLM on the collective transport over both CPU data planes, with 1 and 2 learner ranks.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlsys.algorithms.objectives import SFTObjective
from rlsys.config.loader import load_config
from rlsys.data.collate import pack
from rlsys.data.tasks import load_task
from rlsys.models.loading import load_model, load_tokenizer
from rlsys.placement import Roles
from rlsys.pools import start_pools
from rlsys.types import SamplingParams

# CI covers each engine, transport and data plane once, and the tensor-parallel reshard; the
# 1-rank variants run in the long tier.
LONG = pytest.mark.long
CASES = [  # engine, transport, CPU data plane, learner ranks, engines, engine TP size, LoRA rank
    pytest.param("hf", "object_store", "auto", 1, 2, 1, 0, marks=LONG),
    ("hf", "object_store", "auto", 2, 2, 1, 0),
    pytest.param("vllm", "object_store", "auto", 1, 2, 1, 0, marks=LONG),
    ("vllm", "collective", "shm", 2, 2, 1, 0),
    pytest.param("vllm", "collective", "gloo", 1, 2, 1, 0, marks=LONG),
    ("hf", "collective", "gloo", 2, 2, 1, 0),
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
    bucket_mb = 0.05
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
            f"weight_sync.bucket_mb={bucket_mb}",
        ]
    )
    tok = load_tokenizer(tiny_model_dir)
    task = load_task(cfg.task, seed=0)
    pools = start_pools(cfg, tiny_model_dir, Roles())
    full_bytes = sum(t.numel() * t.element_size() for t in load_model(tiny_model_dir).parameters())
    try:
        fixed = [tok.encode(p.text, add_special_tokens=False) for p in task.eval[:24]]
        train = task.train[:64]
        batch = pack(
            [tok.encode(p.text, add_special_tokens=False) for p in train],
            [tok.encode(p.answer, add_special_tokens=False) + [tok.eos_token_id] for p in train],
            tok.pad_token_id,
        )
        previous = None
        for version in range(1, 4):
            pools.learner.train_step(batch, SFTObjective(), seed=version)
            sent = pools.sync_weights(version)
            assert sent.version == version
            if lora:  # adapters only: a small fraction of the model's bytes
                assert sent.num_tensors == 2 * 7 * 2  # A and B of 7 modules in 2 layers
                assert sent.num_bytes < full_bytes / 4
            assert sent.num_buckets > 1  # bucketed, not one blob (limits: test_transports)
            assert pools.rollout.versions() == [version] * engines
            groups = pools.generate(fixed, SamplingParams(greedy=True, max_new_tokens=6))
            responses = [g[0].token_ids for g in groups]
            assert all(g[0].version == version for g in groups)
            check = pack(fixed, responses, tok.pad_token_id)
            learner_next = pools.learner.greedy_tokens(check)
            mask = check.loss_mask > 0
            targets = check.input_ids[:, 1:]
            np.testing.assert_array_equal(learner_next[mask], targets[mask])
            # the engines really changed between versions (a stale engine would repeat itself
            # while the learner moved on)
            if previous is not None:
                assert responses != previous
            previous = responses
    finally:
        pools.shutdown()
