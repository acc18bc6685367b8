"""The repeated decoder blocks of a model: what FSDP2 shards one by one, what
``learner.compile`` compiles and what ``learner.activation_checkpointing`` recomputes.

Compiling block by block ("regional compilation") instead of the whole model costs one
block's compile, as every block runs the same code: on this project's 2-core Xeon 6-25 s at
the first forward pass (inductor's cache warm or cold) against 95-150 s for the whole model.
Inductor fuses each block's element-wise work (RMSNorm, rotary, SiLU x up, residual adds),
which eager mode runs as separate memory-bound kernels; a bf16 [64, 18, 1024] multiply cost
as much as a matmul there. Measured there, forward + backward + AdamW under bf16 autocast:
64 sequences of 18 tokens on the 3M-parameter built-in model, one thread, 0.14-0.15 s eager
against 0.10-0.12 s compiled; SmolLM2-135M, 32 sequences of 69 tokens, two threads, 3.0-3.2 s
against 2.3-3.1 s, and a lower peak RSS (fewer saved intermediates).
"""

from __future__ import annotations

import functools
import logging
import shutil

import torch
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__name__)

# Where decoder layers live: causal LMs (Llama/Qwen-style, GPT-2, GPT-NeoX) and the critic's
# ValueModel, whose decoder is under ``backbone``.
LAYER_PATHS = (
    "model.layers",
    "transformer.h",
    "gpt_neox.layers",
    "backbone.layers",
    "backbone.h",
    "model.language_model.layers",  # vision-language models (Qwen2-VL, Qwen2.5-VL)
)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's decoder layers, in order; ValueError when none is found at LAYER_PATHS."""
    for path in LAYER_PATHS:
        node = model
        for attr in path.split("."):
            node = getattr(node, attr, None)
        if isinstance(node, torch.nn.ModuleList):
            return list(node)
    raise ValueError(
        f"{type(model).__name__}: cannot find its decoder layers (looked at {list(LAYER_PATHS)}) "
        "to shard or compile them: add its path to LAYER_PATHS in rlsys/models/blocks.py, or "
        "train it on one rank (learner.world_size=1) with learner.compile=false"
    )


def compile_layers(model: torch.nn.Module, device: torch.device, backend: str = "inductor") -> None:
    """``torch.compile`` every decoder layer in place with ``backend``, with dynamic shapes
    (batches change length every step). In place (``Module.compile``): parameter names, state
    dicts and checkpoints stay those of the plain model. Compilation happens at the first call,
    once for all layers, as long as forward passes run with ``use_cache=False`` (every pass of
    the learner does): the KV cache's per-layer index would make each layer a graph of its
    own, past dynamo's recompile limit. On a CPU inductor writes C++, so a C++
    compiler must be installed (``aot_eager`` and ``eager`` generate no code)."""
    if (
        backend == "inductor"
        and device.type == "cpu"
        and not (shutil.which("g++") or shutil.which("c++"))
    ):
        raise RuntimeError(
            "learner.compile=true (or critic.compile=true) on a CPU needs a C++ compiler "
            "(torch.compile's inductor generates C++): install g++ (apt install g++), or set "
            "it to false, or learner.compile_backend=aot_eager (traced, not faster)"
        )
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True, backend=backend)
    log.info(
        "compile: %d decoder layers compile (%s) at the first forward pass (seconds to a "
        "minute; inductor caches its output under $TORCHINDUCTOR_CACHE_DIR, by default "
        "/tmp/torchinductor_<user>, so later runs start faster)",
        len(layers),
        backend,
    )


def _recomputed(forward):
    """``forward`` run under a non-reentrant activation checkpoint while gradients are on."""

    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # no backward will come: nothing to save or recompute
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def checkpoint_layers(model: torch.nn.Module) -> None:
    """Recompute every decoder layer's activations in backward (``learner.
    activation_checkpointing``): the layer's ``forward`` is replaced by a checkpointed call of
    itself, in place, so parameter names and state dicts stay the plain model's.

    Around ``forward`` rather than the module call, so that what runs in ``Module.__call__``
    stays outside the checkpoint: FSDP2's all-gather hooks (the layer's parameters are
    gathered once for forward and once for backward, which also runs the recomputation) and
    a compiled layer's graph (dynamo traces the checkpoint inside it). Non-reentrant: it needs
    no input that requires grad, so it works under LoRA's frozen embeddings, and it accepts
    keyword arguments (the attention mask and rotary embeddings of a Hugging Face layer)."""
    for layer in decoder_layers(model):
        layer.forward = _recomputed(layer.forward)
