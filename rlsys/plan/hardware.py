"""Published GPU and model figures, the assumptions beside them, and clusters of those GPUs.

NOTHING HERE WAS MEASURED BY RLSYS. ``GPUS`` holds vendor datasheet figures (dense BF16
tensor-core throughput, memory, memory and interconnect bandwidth); ``MODELS`` holds the
architectures their authors published (each model's ``config.json`` on the Hugging Face Hub,
``hub_id``; parameter counts from the model cards); ``ASSUMED`` holds efficiencies and
overheads that are typical of the literature, not of any run here. ``memory`` sizes a
candidate's learner and engines from them, ``pricing`` turns them into ``StageCosts``. A user
with real runs replaces the costs: ``rlsys plan --costs costs.json`` (from ``rlsys plan
calibrate``) overrides every constant the calibration identified.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """A decoder's published shape: what its memory, FLOPs and tensor parallelism depend on."""

    params: float
    layers: int  # num_hidden_layers
    hidden: int  # hidden_size
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    intermediate: int  # intermediate_size (the SwiGLU MLP's width)
    vocab: int  # vocab_size
    hub_id: str | None = None

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise WorkloadError(
                f"--model: hidden={self.hidden} must divide by heads={self.heads}, and heads "
                f"by kv_heads={self.kv_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> float:
        """The KV cache of one token over every layer (K and V)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def splits_over(self, tp: int) -> bool:
        """Whether ``tp`` shards each hold whole attention heads and whole KV heads (vLLM
        needs the first; the second keeps the KV cache split, not replicated, which is what
        ``memory.engine_max_seqs`` assumes)."""
        return self.heads % tp == 0 and self.kv_heads % tp == 0


# Shapes from each hub id's config.json (Qwen2.5 0.5B and 1.5B tie their embeddings; the
# others do not); parameter counts from the model cards.
MODELS = {
    "qwen2.5-0.5b": Model(0.494e9, 24, 896, 14, 2, 4864, 151936, "Qwen/Qwen2.5-0.5B-Instruct"),
    "qwen2.5-1.5b": Model(1.54e9, 28, 1536, 12, 2, 8960, 151936, "Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen2.5-7b": Model(7.61e9, 28, 3584, 28, 4, 18944, 152064, "Qwen/Qwen2.5-7B-Instruct"),
    "llama3-8b": Model(
        8.03e9, 32, 4096, 32, 8, 14336, 128256, "meta-llama/Meta-Llama-3-8B-Instruct"
    ),
    "qwen2.5-14b": Model(14.7e9, 48, 5120, 40, 8, 13824, 152064, "Qwen/Qwen2.5-14B-Instruct"),
    "qwen2.5-32b": Model(32.5e9, 64, 5120, 40, 8, 27648, 152064, "Qwen/Qwen2.5-32B-Instruct"),
    "llama3-70b": Model(
        70.6e9, 80, 8192, 64, 8, 28672, 128256, "meta-llama/Meta-Llama-3-70B-Instruct"
    ),
}

# Assumptions (typical published efficiencies and overheads; none measured here).
ASSUMED = {
    "train_mfu": 0.40,  # learner FLOPs utilisation (FSDP)
    "prefill_mfu": 0.50,
    "decode_mfu": 0.30,  # per-token compute in a decode step
    "hbm_efficiency": 0.70,  # achieved fraction of HBM bandwidth when reading weights / KV
    "network_efficiency": 0.70,  # achieved fraction of link bandwidth (collectives)
    "host_gb_per_s": 25.0,  # GPU <-> host, one GPU (PCIe Gen5 x16, achieved)
    # one pass over host memory by one process: a copy into Ray's object store, a bucket
    # packed or serialised for vLLM's worker RPC (a memcpy runs at tens of GB/s at best)
    "host_copy_gb_per_s": 10.0,
    "gen_call_s": 0.05,  # scheduling and Ray round trip of one generation request
    "step_overhead_s": 0.2,  # controller work per step (batching, advantages, metrics)
    "sync_call_s": 0.1,  # per weight update besides the bytes (bucketing, engine reload)
    "score_sample_s": 0.001,  # a rule-based verifier per sample, on the controller's thread
    "tp_step_latency_s": 20e-6,  # per layer and decode step, tensor-parallel all-reduces
    # of a GPU's memory nothing may plan on: CUDA context, NCCL buffers, allocator
    # fragmentation, FSDP's gathered layers
    "memory_reserve_frac": 0.10,
    "engine_memory_frac": 0.90,  # vLLM gpu_memory_utilization with the GPU to itself
}


def parse_model(spec: str) -> Model:
    """A name of ``MODELS`` or
    ``params=7.6e9,layers=28,hidden=3584,heads=28,kv_heads=4,intermediate=18944,vocab=152064``."""
    if spec.lower() in MODELS:
        return MODELS[spec.lower()]
    keys = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")
    try:
        given = dict(part.split("=", 1) for part in spec.split(","))
        return Model(float(given["params"]), *(int(given[k]) for k in keys))
    except (ValueError, KeyError) as exc:
        raise WorkloadError(
            f"--model {spec!r}: give one of {sorted(MODELS)} or 'params=P,"
            + ",".join(f"{k}=N" for k in keys)
            + "' (the model's config.json: num_hidden_layers, hidden_size, "
            "num_attention_heads, num_key_value_heads, intermediate_size, vocab_size)"
        ) from exc


def parse_gpu(name: str) -> GPU:
    if name.upper() not in GPUS:
        raise WorkloadError(f"--cluster gpu={name!r}: known GPUs are {sorted(GPUS)}")
    return GPUS[name.upper()]


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` GPUs named in ``GPUS``."""

    nodes: int
    gpus_per_node: int
    gpu_name: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu(self) -> GPU:
        return parse_gpu(self.gpu_name)

    @property
    def node_gpus(self) -> list[float]:
        """GPUs per node (``placement.resources.check_fits`` and ``placement.check.predict``
        take it)."""
        return [float(self.gpus_per_node)] * self.nodes

    @classmethod
    def parse(cls, spec: str) -> Cluster:
        """``nodes=8,gpus_per_node=8,gpu=H100``."""
        try:
            keys = dict(part.split("=", 1) for part in spec.split(","))
            cluster = cls(int(keys["nodes"]), int(keys["gpus_per_node"]), keys["gpu"])
        except (ValueError, KeyError) as exc:
            raise WorkloadError(
                f"--cluster {spec!r}: give 'nodes=N,gpus_per_node=G,gpu=NAME'"
            ) from exc
        if cluster.nodes < 1 or cluster.gpus_per_node < 1:
            raise WorkloadError(f"--cluster {spec!r}: nodes and gpus_per_node must be >= 1")
        cluster.gpu  # noqa: B018 - names the known GPUs if this one is not
        return cluster
