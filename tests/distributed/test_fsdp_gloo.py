"""FSDP2 on gloo in real processes: 2 ranks train exactly like 1, weights gather in buckets."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from backend_harness import free_port, toy_batch

from rlsys.algorithms.objectives import PolicyObjective, SFTObjective, ValueObjective
from rlsys.config.learner import OptimConfig


def _worker(rank, world_size, port, model_dir, objective, bucket_bytes, out_dir, role):
    import torch.distributed as dist

    from rlsys.backends.fsdp import FSDP2Backend

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    backend = FSDP2Backend(
        model_dir,
        "float32",
        OptimConfig(lr=1e-3, warmup_steps=0),
        micro_batch_size=2,
        temperature=1.0,
        device=torch.device("cpu"),
        role=role,
    )
    batch = toy_batch(model_dir)
    forward = backend.forward_logprobs if role == "policy" else backend.forward_values
    rows, logprobs = forward(batch)
    metrics = backend.train_step(batch, objective, num_mini_batches=2, epochs=1, seed=0)
    buckets = list(backend.iter_weight_buckets(bucket_bytes))
    if rank == 0:
        state = {k: v for b in buckets for k, v in b.items()}
        sizes = [sum(t.numel() * t.element_size() for t in b.values()) for b in buckets]
        biggest = max(t.numel() * t.element_size() for t in state.values())
        torch.save(
            {
                "state": state,
                "metrics": metrics,
                "sizes": sizes,
                "biggest": biggest,
                "n_buckets": len(buckets),
            },
            os.path.join(out_dir, "out.pt"),
        )
    torch.save({"rows": rows, "logprobs": logprobs}, os.path.join(out_dir, f"fwd{rank}.pt"))
    dist.destroy_process_group()


def _run(world_size, model_dir, objective, tmp_path, bucket_bytes=1 << 30, role="policy"):
    out = tmp_path / f"ws{world_size}"
    out.mkdir()
    mp.spawn(
        _worker,
        args=(world_size, free_port(), model_dir, objective, bucket_bytes, str(out), role),
        nprocs=world_size,
        join=True,
    )
    result = torch.load(out / "out.pt", weights_only=False)
    fwd = [torch.load(out / f"fwd{r}.pt", weights_only=False) for r in range(world_size)]
    logprobs = np.zeros((11, fwd[0]["logprobs"].shape[1]), np.float32)
    for part in fwd:
        logprobs[part["rows"]] = part["logprobs"]
    return result, logprobs


OBJECTIVES = {
    "sft": (SFTObjective(), "policy"),
    "ppo": (PolicyObjective(dual_clip=3.0), "policy"),
    "gspo": (PolicyObjective("gspo", 3e-4, 4e-4, loss_agg="seq_mean_token_mean"), "policy"),
    "dr_grpo": (PolicyObjective(loss_agg="seq_sum_norm", loss_agg_norm=8.0), "policy"),
    "critic": (ValueObjective(clip=0.2), "value"),
}


@pytest.mark.parametrize("case", list(OBJECTIVES))
def test_two_ranks_train_exactly_like_one(tiny_model_dir, tmp_path, case):
    """Every loss aggregation (token mean, sequence means, constant normaliser) and the critic
    give one process's loss, gradient and update when sharded over 2 ranks."""
    objective, role = OBJECTIVES[case]
    one, lp1 = _run(1, tiny_model_dir, objective, tmp_path, role=role)
    two, lp2 = _run(2, tiny_model_dir, objective, tmp_path, role=role)
    np.testing.assert_allclose(lp1, lp2, atol=1e-5)  # sharded forward == unsharded
    assert one["metrics"]["trained_tokens"] == two["metrics"]["trained_tokens"]
    assert one["metrics"]["loss"] == pytest.approx(two["metrics"]["loss"], rel=1e-4)
    assert one["metrics"]["grad_norm"] == pytest.approx(two["metrics"]["grad_norm"], rel=1e-4)
    assert one["state"].keys() == two["state"].keys()
    for name, tensor in one["state"].items():
        torch.testing.assert_close(
            two["state"][name],
            tensor,
            atol=2e-5,
            rtol=1e-4,
            msg=f"parameter {name} differs after one step",
        )
    from rlsys.models.loading import load_model
    from rlsys.models.value import load_value_model

    loader = load_model if role == "policy" else load_value_model
    before = loader(tiny_model_dir).state_dict()
    moved = [n for n, t in one["state"].items() if not torch.equal(t, before[n])]
    assert len(moved) == len(one["state"])  # every parameter was trained


def test_weight_buckets_respect_the_size_limit_and_send_tied_weights_once(tmp_path):
    from rlsys.config.schema import ModelConfig
    from rlsys.models.builtin import builtin_dir

    tied_dir = str(builtin_dir(ModelConfig(tie_word_embeddings=True)))
    limit = 64 * 1024
    out, _ = _run(2, tied_dir, SFTObjective(), tmp_path, bucket_bytes=limit)
    assert out["n_buckets"] > 3
    assert all(size <= max(limit, out["biggest"]) for size in out["sizes"])
    # tied embeddings are sent once
    assert "lm_head.weight" not in out["state"] and "model.embed_tokens.weight" in out["state"]
