"""One candidate of the placement search, described once: ``Layout``.

A layout holds every setting that the cost model prices (``pricing.stage_costs``) and that
the printed command sets (``Layout.overrides``): pools and GPUs per actor, the weight
transport, the dtypes, the learner's micro-batch token budget and activation checkpointing,
the engines' memory share and batch sizes. Both read the same fields, so what is printed is
what was priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlsys.plan.hardware import Model
from rlsys.plan.workload import Placement, Workload

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Precision:
    """The dtypes of a run: the learner's weights, gradients and AdamW state (``model.dtype``),
    its compute (``learner.mixed_precision``; None: ``model.dtype``) and the engines' weights
    and KV cache (``rollout.dtype``)."""

    model_dtype: str
    compute_dtype: str | None
    engine_dtype: str
    label: str

    @property
    def learner_bytes_per_param(self) -> int:
        """Weights, gradients and AdamW's two moments, all in ``model.dtype``."""
        return 4 * DTYPE_BYTES[self.model_dtype]

    @property
    def sync_bytes_per_param(self) -> int:
        """A weight update carries the learner's parameter dtype (the engines cast it:
        ``LearnerBackend.iter_weight_buckets`` sends tensors as they are)."""
        return DTYPE_BYTES[self.model_dtype]

    @property
    def engine_bytes_per_param(self) -> int:
        return DTYPE_BYTES[self.engine_dtype]

    @property
    def activation_bytes(self) -> int:
        return DTYPE_BYTES[self.compute_dtype or self.model_dtype]

    def overrides(self) -> list[str]:
        compute = self.compute_dtype or "null"
        return [
            f"model.dtype={self.model_dtype}",
            f"learner.mixed_precision={compute}",
            f"rollout.dtype={self.engine_dtype}",
        ]


# rlsys's setting for real models on GPUs: fp32 master weights, bf16 compute and engines
MIXED_BF16 = Precision("float32", "bfloat16", "bfloat16", "fp32 master weights, bf16 compute")


def weight_transport(colocated: bool, engine_gpus: int) -> str:
    """The ``weight_sync.transport`` a GPU layout can use (rlsys/resolve/across.py,
    ``_check_gpu_transport``): disaggregated pools broadcast over NCCL (``collective``);
    colocated, learner rank 0 shares its GPU with engine 0, where NCCL refuses two members of
    one group, so CUDA IPC when that is the only engine GPU, else host copies through Ray's
    object store."""
    if not colocated:
        return "collective"
    return "cuda_ipc" if engine_gpus == 1 else "object_store"


@dataclass(frozen=True)
class Layout:
    """A run on a GPU cluster: what the cost model prices and the command sets."""

    model: Model
    colocated: bool  # placement.mode; colocated engines sleep while the learners train
    engines: int  # rollout.num_workers
    engine_tp: int  # GPUs per engine: rollout.num_gpus_per_worker = tensor_parallel_size
    learner_ranks: int  # learner.world_size, one GPU each
    max_staleness: int
    partial: bool  # rollout.partial_rollouts
    transport: str  # weight_sync.transport
    precision: Precision
    activation_checkpointing: bool  # learner.activation_checkpointing
    micro_batch_tokens: int  # learner.max_tokens_per_micro_batch
    micro_batch_rows: int  # learner.micro_batch_size (not binding below the token budget)
    engine_memory_frac: float  # rollout.vllm.gpu_memory_utilization
    max_num_seqs: int  # rollout.vllm.max_num_seqs: a request's sequences, within the KV cache
    prompts_per_request: int  # rollout.prompts_per_request

    @property
    def rollout_gpus(self) -> int:
        return self.engines * self.engine_tp

    @property
    def gpus(self) -> int:
        """GPUs the layout uses (colocated pools share theirs)."""
        if self.colocated:
            return max(self.rollout_gpus, self.learner_ranks)
        return self.rollout_gpus + self.learner_ranks

    @property
    def off_policy(self) -> str:
        """``algorithm.off_policy``: stale samples are reweighted (truncated IS)."""
        return "tis" if self.max_staleness else "none"

    @property
    def engine_weight_bytes(self) -> float:
        return self.precision.engine_bytes_per_param * self.model.params

    @property
    def sync_bytes(self) -> float:
        """What one weight update sends."""
        return self.precision.sync_bytes_per_param * self.model.params

    def needs_logprobs(self, work: Workload) -> bool:
        """Whether the learner runs a log-probability pass of its own before training (the
        rule ``rlsys train`` applies to the printed config)."""
        from rlsys.algorithms.objectives import needs_old_logprobs  # imports torch: only here

        return needs_old_logprobs(work.ppo_epochs, work.mini_batches, self.off_policy, False)

    def placement(self) -> Placement:
        """The placement the simulator runs."""
        return Placement(
            rollout_workers=self.engines,
            learner_ranks=self.learner_ranks,
            max_staleness=self.max_staleness,
            partial=self.partial,
            colocated=self.colocated,
            prompts_per_request=self.prompts_per_request,
            engine_tp=self.engine_tp,
        )

    def overrides(self, work: Workload) -> list[str]:
        """``rlsys train`` (or ``rlsys submit``) overrides that run this layout on ``work``."""
        mode = "colocated" if self.colocated else "disaggregated"
        out = [
            f"placement={mode}",
            f"placement.engine_sleep={_flag(self.colocated)}",
            "rollout.engine=vllm",
            f"rollout.num_workers={self.engines}",
            f"rollout.num_gpus_per_worker={self.engine_tp}",
            f"rollout.vllm.tensor_parallel_size={self.engine_tp}",
            f"rollout.vllm.gpu_memory_utilization={self.engine_memory_frac:g}",
            f"rollout.vllm.max_num_seqs={self.max_num_seqs}",
            f"rollout.prompts_per_request={self.prompts_per_request}",
            f"learner.world_size={self.learner_ranks}",
            "learner.num_gpus_per_rank=1",
            f"learner.max_tokens_per_micro_batch={self.micro_batch_tokens}",
            f"learner.micro_batch_size={self.micro_batch_rows}",
            f"learner.activation_checkpointing={_flag(self.activation_checkpointing)}",
            f"learner.ppo_epochs={work.ppo_epochs}",
            f"learner.num_mini_batches={work.mini_batches}",
            *self.precision.overrides(),
            f"weight_sync.transport={self.transport}",
            f"buffer.max_staleness={self.max_staleness}",
            f"data.batch_size={work.batch_size}",
            f"rollout.n_samples={work.n_samples}",
            f"task.max_new_tokens={max(work.lengths.values)}",
        ]
        if self.partial:
            out.append("rollout.partial_rollouts=true")
        if self.off_policy != "none":
            out.append(f"algorithm.off_policy={self.off_policy}")
        if self.model.hub_id:
            out.append(f"model.path={self.model.hub_id}")
        return out


def _flag(value: bool) -> str:
    return "true" if value else "false"


def row_tokens(work: Workload) -> int:
    """A training row's length: the learner pads every row of a batch to its longest
    (``backends/data_parallel.py``), prompt + the longest reply."""
    return math.ceil(work.prompt_tokens + max(work.lengths.values))
