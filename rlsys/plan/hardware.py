"""Published GPU and model figures, and the stage costs they imply for one engine or rank.

NOTHING HERE WAS MEASURED BY RLSYS. ``GPUS`` holds vendor datasheet figures (dense BF16
tensor-core throughput, memory, memory and interconnect bandwidth); ``MODELS`` holds the
architectures their authors published; ``ASSUMED`` holds efficiencies and overheads that are
typical of the literature, not of any run here. ``costs_for`` turns them into ``StageCosts``
with the usual first-order formulas (2 x params FLOPs per token forward, 6 x params + a
recomputed forward (8 x params) for training, decode bound by reading the weights). A user
with real runs replaces them: ``rlsys plan --costs costs.json`` (from ``rlsys plan
calibrate``) overrides every constant the calibration identified.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.plan.costs import StageCosts
from rlsys.plan.workload import WorkloadError

GB = 1e9


@dataclass(frozen=True)
class GPU:
    """Datasheet figures of one GPU (published, not measured here)."""

    memory_gb: float
    bf16_tflops: float  # dense (no sparsity)
    hbm_gb_per_s: float
    nvlink_gb_per_s: float  # per GPU, one direction (within a node)
    network_gb_per_s: float  # per GPU, between nodes (InfiniBand of the reference system)
    source: str


GPUS = {
    "H100": GPU(80, 989, 3350, 450, 50, "NVIDIA H100 SXM5 datasheet; DGX H100 (8x400 Gb/s NDR)"),
    "H200": GPU(141, 989, 4800, 450, 50, "NVIDIA H200 SXM datasheet; HGX H200 (8x400 Gb/s)"),
    "A100": GPU(80, 312, 2039, 300, 25, "NVIDIA A100 SXM4 80GB datasheet; DGX A100 (8x200 Gb/s)"),
    "L40S": GPU(48, 362, 864, 32, 25, "NVIDIA L40S datasheet (PCIe Gen4 x16, no NVLink)"),
}


@dataclass(frozen=True)
class Model:
    """A model's published architecture (what memory and FLOPs depend on)."""

    params: float
    layers: int
    kv_heads: int
    head_dim: int
    hub_id: str | None = None

    @property
    def weight_bytes(self) -> float:
        return 2.0 * self.params  # bf16

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


MODELS = {
    "qwen2.5-1.5b": Model(1.54e9, 28, 2, 128, "Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen2.5-7b": Model(7.62e9, 28, 4, 128, "Qwen/Qwen2.5-7B-Instruct"),
    "llama3-8b": Model(8.03e9, 32, 8, 128, "meta-llama/Meta-Llama-3-8B-Instruct"),
    "qwen2.5-14b": Model(14.7e9, 48, 8, 128, "Qwen/Qwen2.5-14B-Instruct"),
    "qwen2.5-32b": Model(32.5e9, 64, 8, 128, "Qwen/Qwen2.5-32B-Instruct"),
    "llama3-70b": Model(70.6e9, 80, 8, 128, "meta-llama/Meta-Llama-3-70B-Instruct"),
}

# Assumptions (typical published efficiencies and overheads; none measured here).
ASSUMED = {
    "train_mfu": 0.40,  # learner FLOPs utilisation (FSDP, activation checkpointing)
    "prefill_mfu": 0.50,
    "decode_mfu": 0.30,  # per-token compute in a decode step
    "hbm_efficiency": 0.70,  # achieved fraction of HBM bandwidth when reading weights / KV
    "network_efficiency": 0.70,  # achieved fraction of link bandwidth (collectives)
    "host_gb_per_s": 25.0,  # GPU <-> host (PCIe Gen5 x16, achieved) for engine sleep / wake
    "gen_call_s": 0.05,  # scheduling and Ray round trip of one generation request
    "step_overhead_s": 0.2,  # controller work per step (batching, advantages, metrics)
    "sync_call_s": 0.1,  # per weight update besides the bytes (bucketing, engine reload)
    "score_sample_s": 0.001,  # a rule-based verifier per sample, on the controller's thread
    "tp_step_latency_s": 20e-6,  # per layer and decode step, tensor-parallel all-reduces
    "learner_bytes_per_param": 16.0,  # bf16 weights + grads, fp32 master + Adam (ZeRO paper)
    "activation_frac": 0.25,  # of a learner GPU's memory kept for activations
    "engine_memory_frac": 0.90,  # vLLM gpu_memory_utilization the search uses
}


def parse_model(spec: str) -> Model:
    """A name of ``MODELS`` or ``params=7.6e9,layers=28,kv_heads=4,head_dim=128``."""
    if spec.lower() in MODELS:
        return MODELS[spec.lower()]
    try:
        keys = dict(part.split("=", 1) for part in spec.split(","))
        return Model(
            float(keys["params"]), int(keys["layers"]), int(keys["kv_heads"]),
            int(keys["head_dim"]),
        )  # fmt: skip
    except (ValueError, KeyError) as exc:
        raise WorkloadError(
            f"--model {spec!r}: give one of {sorted(MODELS)} or "
            "'params=P,layers=L,kv_heads=K,head_dim=D'"
        ) from exc


def parse_gpu(name: str) -> GPU:
    if name.upper() not in GPUS:
        raise WorkloadError(f"--cluster gpu={name!r}: known GPUs are {sorted(GPUS)}")
    return GPUS[name.upper()]


def costs_for(
    gpu: GPU,
    model: Model,
    tp: int,
    n_samples: int,
    context_tokens: float,
    learner_ranks: int,
    gpus_per_node: int,
    colocated: bool,
) -> StageCosts:
    """Stage costs of one engine over ``tp`` GPUs and learner ranks of one GPU each, from
    published figures and ``ASSUMED`` (``context_tokens``: a sequence's mean KV length)."""
    a = ASSUMED
    flops, hbm = gpu.bf16_tflops * 1e12, gpu.hbm_gb_per_s * GB * a["hbm_efficiency"]
    p = model.params
    step = model.weight_bytes / tp / hbm
    if tp > 1:
        step += a["tp_step_latency_s"] * model.layers
    kv_read = model.kv_bytes_per_token * context_tokens / tp / hbm
    within_node = learner_ranks <= gpus_per_node
    link = gpu.nvlink_gb_per_s if within_node else gpu.network_gb_per_s
    # colocated: CUDA IPC within the device; else an NCCL broadcast across the network
    sync_bw = (hbm if colocated else gpu.network_gb_per_s * GB * a["network_efficiency"]) * tp
    host = a["host_gb_per_s"] * GB * tp
    return StageCosts(
        gen_call_s=a["gen_call_s"],
        gen_prompt_token_s=2 * p / (tp * flops * a["prefill_mfu"]),
        gen_step_s=step,
        gen_token_s=2 * p / (tp * flops * a["decode_mfu"]) + kv_read,
        logprob_token_s=2 * p / (flops * a["train_mfu"]),
        train_token_s=8 * p / (flops * a["train_mfu"]),
        grad_bytes=2 * p,
        allreduce_bytes_per_s=link * GB * a["network_efficiency"],
        sync_call_s=a["sync_call_s"],
        sync_byte_s=1 / sync_bw,
        score_group_s=a["score_sample_s"] * n_samples,
        step_overhead_s=a["step_overhead_s"],
        engine_sleep_s=model.weight_bytes / host if colocated else 0.0,
        engine_wake_s=model.weight_bytes / host if colocated else 0.0,
    )


def learner_fits(gpu: GPU, model: Model, ranks: int) -> bool:
    """Whether FSDP full sharding over ``ranks`` GPUs holds the training state, leaving
    ``activation_frac`` of each GPU for activations."""
    per_rank = ASSUMED["learner_bytes_per_param"] * model.params / ranks
    return per_rank <= (1 - ASSUMED["activation_frac"]) * gpu.memory_gb * GB


def engine_max_seqs(gpu: GPU, model: Model, tp: int, context_tokens: float) -> int:
    """Sequences one engine over ``tp`` GPUs keeps in its KV cache at once (0: the weights do
    not fit)."""
    free = ASSUMED["engine_memory_frac"] * gpu.memory_gb * GB * tp - model.weight_bytes
    if free <= 0:
        return 0
    return int(free / (model.kv_bytes_per_token * context_tokens))
