"""Helpers for the backend tests: a toy batch, gloo (or NCCL) process groups in real
processes, and building a backend and reading its full weights there."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp

from rlsys.config.learner import DeepSpeedConfig, LearnerConfig, OptimConfig
from rlsys.data.collate import pack

NO_DEEPSPEED = "DeepSpeed is not installed: bash scripts/setup.sh installs it (DS_BUILD_OPS=0)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toy_batch(
    model_dir: str,
    seed: int = 0,
    rows: int = 11,
    mixed: bool = False,
    grouped: bool = False,
    inert: int = 0,
):
    """``rows`` arithmetic prompts with random responses, advantages and returns; ``mixed``:
    responses of 1 to 12 digits, so that rows pack 2-3 a packed row (learner.packing);
    ``grouped``: groups of 4 rows share a prompt (learner.share_prompts); ``inert``: the
    first ``inert`` rows' advantages are 0 (tied groups: learner.skip_zero_advantage)."""
    from rlsys.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    rng = np.random.default_rng(seed)
    prompts = [
        tok.encode(f"{a}+{b}=", add_special_tokens=False)
        for a, b in rng.integers(0, 100, (rows, 2))
    ]
    if grouped:
        prompts = [prompts[i // 4] for i in range(rows)]
    digits = rng.integers(1, 13, rows) if mixed else None
    responses = [
        tok.encode(
            "".join(map(str, rng.integers(0, 10, digits[i])))
            if mixed
            else str(rng.integers(0, 999)),
            add_special_tokens=False,
        )
        + [tok.eos_token_id]
        for i in range(len(prompts))
    ]
    batch = pack(prompts, responses, tok.pad_token_id)
    batch.old_logprobs = np.zeros_like(batch.loss_mask) - 3.0
    batch.advantages = (
        rng.standard_normal(len(prompts)).astype(np.float32)[:, None] * batch.loss_mask
    )
    batch.advantages[:inert] = 0.0
    batch.values = np.zeros_like(batch.loss_mask)
    batch.returns = batch.advantages.copy()
    return batch


def _entry(rank, fn, world_size, port, out_dir, args, backend):
    import torch.distributed as dist

    torch.set_num_threads(1)
    if backend == "nccl":  # one GPU per rank: NCCL refuses two ranks on one device
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears the group down while another still talks on it
    finally:
        dist.destroy_process_group()
    exit_without_finalizing()


def exit_without_finalizing() -> None:
    """End a finished rank process here, skipping the interpreter's finalization.

    Rank processes now and then died of SIGABRT ("terminate called without an active
    exception") with their work done: CI of 5e05cfc lost two checkpoint tests to it, and
    one of three local runs of them lost one (none in about 30 later runs). The
    likeliest cause: a backend (FSDP2's mesh, DeepSpeed's groups) keeps gloo process groups
    alive past ``destroy_process_group``, and at finalization a gloo thread that must take
    the GIL is ended by a forced unwind, which the C++ runtime turns into an abort."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn, world_size: int, out_dir: Path, *args, backend: str = "gloo") -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes of a ``backend``
    group (nccl: rank r on GPU r); what each returns (saved with torch.save), by rank."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mp.spawn(
        _entry,
        args=(fn, world_size, free_port(), str(out_dir), args, backend),
        nprocs=world_size,
        join=True,
    )
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


def learner_config(kind: str, **optim) -> LearnerConfig:
    """A learner config for ``kind``: fsdp2, zero2, zero3 (every parameter sharded), or
    zero2_offload / zero3_offload; micro-batches of 2 rows."""
    ds = DeepSpeedConfig(
        zero_stage=3 if kind.startswith("zero3") else 2,
        param_persistence_threshold=0,
    )
    return LearnerConfig(
        backend="fsdp2" if kind == "fsdp2" else "deepspeed",
        micro_batch_size=2,
        offload=kind.endswith("offload"),
        optim=OptimConfig(**{"lr": 1e-3, "warmup_steps": 0, **optim}),
        deepspeed=ds,
    )


def build(
    kind: str, model_dir: str, role: str = "policy", dtype: str = "float32", lora=None, **optim
):
    """A backend of ``kind`` (see learner_config) on the CPU, in an initialised group;
    ``lora``: a ``LoraConfig`` (adapters only)."""
    from rlsys.backends import build_backend

    cfg = learner_config(kind, **optim)
    return build_backend(cfg, model_dir, dtype, 1.0, torch.device("cpu"), role, lora=lora)


def full_state(backend, bucket_bytes: int = 1 << 30) -> dict[str, torch.Tensor]:
    """Every full weight (on rank 0; empty elsewhere), copied."""
    return {
        k: v.detach().clone()
        for bucket in backend.iter_weight_buckets(bucket_bytes)
        for k, v in bucket.items()
    }


def train_on(backend, model_dir: str, objective) -> dict:
    """Two more train_steps on fresh batches: their metrics and the weights after."""
    metrics = [
        backend.train_step(toy_batch(model_dir, seed), objective, 2, 1, seed=seed)
        for seed in (1, 2)
    ]
    return {"metrics": metrics, "state": full_state(backend)}
