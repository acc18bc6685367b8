"""The search's memory model: what a learner rank and an engine hold on one GPU, and the
settings that keep them within it (the micro-batch token budget, activation checkpointing,
the engines' share of memory and their KV cache).

First-order, from the published shapes (``hardware.MODELS``) and ``ASSUMED``; nothing here
was measured by rlsys. Per learner rank (FSDP2, fully sharded): the training state, a
micro-batch's activations and one slice of LM-head logits, within ``1 - memory_reserve_frac``
of the GPU. Colocated engines sleep while the learners train (their memory freed), but
generate beside the learners' resident state, so they get what that state leaves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlsys.config.learner import LearnerConfig
from rlsys.plan.hardware import ASSUMED, GB, GPU, Model
from rlsys.plan.layout import Precision

BUDGET_STEP = 1024  # token budgets are printed rounded down to this


def learner_state_bytes(model: Model, precision: Precision, ranks: int) -> float:
    """One rank's share of the weights, gradients and AdamW state (FSDP2 full sharding)."""
    return precision.learner_bytes_per_param * model.params / ranks


def activation_bytes_per_token(model: Model, precision: Precision, checkpointing: bool) -> float:
    """What training keeps per token of a micro-batch for the backward pass.

    A decoder layer saves (``a``: bytes of the compute dtype, ``h`` hidden, ``kv`` the
    KV heads' width, ``I`` the MLP's): two RMSNorm inputs with their fp32 copies
    (2 (a + 4) h), the normed inputs of the attention and MLP projections (2 a h), the
    attention's q, k, v and output (a (2 h + 2 kv)), the output projection's input (a h), and
    the SwiGLU's gate, up, activation and product (4 a I). With activation checkpointing a
    layer keeps only its input (a h), and one layer's activations are rebuilt at a time in
    the backward pass."""
    a, h, i = precision.activation_bytes, model.hidden, model.intermediate
    kv = model.kv_heads * model.head_dim
    layer = 7 * a * h + 8 * h + 2 * a * kv + 4 * a * i
    if checkpointing:
        return model.layers * a * h + layer
    return model.layers * layer


def logits_bytes(model: Model) -> float:
    """One slice of LM-head logits in fp32 with its gradient (``learner.logits_chunk_tokens``
    positions at a time, its default)."""
    chunk = LearnerConfig().logits_chunk_tokens or 0
    return 2 * 4 * chunk * model.vocab


@dataclass(frozen=True)
class MicroBatch:
    """A learner rank's micro-batch settings."""

    checkpointing: bool  # learner.activation_checkpointing
    tokens: int  # learner.max_tokens_per_micro_batch
    rows: int  # learner.micro_batch_size


def fit_micro_batch(
    gpu: GPU, model: Model, precision: Precision, ranks: int, row_tokens: int
) -> MicroBatch | None:
    """The largest micro-batch token budget one of ``ranks`` learner ranks holds, without
    activation checkpointing if a row of ``row_tokens`` fits so (a micro-batch holds at
    least one row), else with it; None: not even one row fits beside the state."""
    usable = (1 - ASSUMED["memory_reserve_frac"]) * gpu.memory_gb * GB
    free = usable - learner_state_bytes(model, precision, ranks) - logits_bytes(model)
    for checkpointing in (False, True):
        tokens = int(free // activation_bytes_per_token(model, precision, checkpointing))
        if tokens >= row_tokens:
            budget = max(row_tokens, tokens // BUDGET_STEP * BUDGET_STEP)
            return MicroBatch(checkpointing, budget, max(1, budget // row_tokens))
    return None


def engine_memory_frac(
    gpu: GPU, model: Model, precision: Precision, learner_ranks: int, colocated: bool
) -> float:
    """``rollout.vllm.gpu_memory_utilization``: the GPU less the reserve, and, colocated,
    less the learner's resident state (two decimals, rounded down)."""
    frac = 1 - ASSUMED["memory_reserve_frac"]
    if colocated:
        frac -= learner_state_bytes(model, precision, learner_ranks) / (gpu.memory_gb * GB)
    return math.floor(frac * 100) / 100


def engine_max_seqs(
    gpu: GPU, model: Model, precision: Precision, tp: int, frac: float, context_tokens: float
) -> int:
    """Sequences of ``context_tokens`` one engine over ``tp`` GPUs keeps in its KV cache at
    once with ``frac`` of each GPU (0: its weights do not fit)."""
    weights = precision.engine_bytes_per_param * model.params
    free = frac * gpu.memory_gb * GB * tp - weights
    if free <= 0:
        return 0
    per_token = model.kv_bytes_per_token(precision.engine_bytes_per_param)
    return int(free / (per_token * context_tokens))
