"""The built-in HF engine's own settings, ``rollout.engine_args`` when ``rollout.engine=hf``
(torch-free: the config checks them without loading the engine)."""

from __future__ import annotations

from dataclasses import dataclass

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DECODE_ATTENTION = ("auto", "sdpa", "matmul")


@dataclass(frozen=True)
class HFSettings:
    """``rollout.engine_args={compile: true}`` decodes with a static KV cache and the model's
    forward step compiled by ``torch.compile`` (transformers' compiled ``generate``). The
    first calls pay the compile, and every new batch size (a multi-turn or asynchronous
    rollout's calls vary) compiles again (on a GPU, ``reduce-overhead`` records a CUDA graph
    per shape); the cache grows to the longest prompt + budget seen and keeps that size. Needs
    a C++ compiler on CPU. On this project's 2-core CPU it decoded 0.71-0.93x as fast as the
    eager loop, so it is off (docs/roofline.md, "A compiled decode loop").

    ``decode_attention`` picks how a decode step (one new token a row) attends in a model on
    SDPA: ``matmul`` computes it as two matmuls (rlsys/models/attention.py), ``sdpa`` calls
    torch's kernel, ``auto`` is matmul on CPUs and sdpa on GPUs (their kernels are fast for one
    query token). Prefill is SDPA either way; a vision-language model keeps SDPA throughout.

    ``share_prefill`` runs a prompt's prefill once for all its ``n`` samples and copies the KV
    cache to each sample's row, where ``generate`` would otherwise prefill the same prompt ``n``
    times; the head that a micro-batch's distinct prompts share (a chat template's system
    turn) is prefilled once for all of them (rlsys/engines/prefill.py). Same tokens and
    log-probabilities up to the dtype's rounding (fp32: equal to 1e-5); off for the compiled
    loop (its static cache) and for vision-language models.

    ``shrink_batch`` decodes in rlsys's own loop, where a row that has ended (a stop token or
    its budget) leaves the batch with its KV cache, instead of ``generate``'s, which decodes
    every row until the longest ends (rlsys/engines/shrinking.py). Same greedy tokens and
    log-probabilities; off for the compiled loop, vision-language models and stop strings
    (those calls go to ``generate``).

    ``cache_in_place`` keeps that loop's KV cache in buffers with room for the tokens to come,
    each decode step writing its token in place, where transformers' dynamic cache copies the
    whole cache every step (rlsys/engines/kv_cache.py). Bit-equal replies and
    log-probabilities; false only for a custom attention that needs its keys contiguous.

    ``prepack`` keeps a CPU engine's linear weights packed in oneDNN's blocked layout, once per
    weight version, instead of ``F.linear`` reordering them on every call
    (rlsys/engines/packed_linear.py): decode steps of a few rows gain most. It costs a second
    copy of the linear weights in memory and a packing pass after each weight load; bf16
    logits came out bit-equal here, fp32 ones within rounding. Ignored on GPUs, for the
    compiled loop, and where oneDNN cannot pack the model's dtype on this CPU.

    ``fuse_linears`` (with ``prepack``) packs the sibling layers a decoder layer multiplies
    by one input as one weight (``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``):
    one call of a wider layer each, in place of three and two; the same outputs as the
    layers packed apart (rlsys/engines/packed_linear.py, "Fused siblings")."""

    compile: bool = False
    # torch.compile mode of the decode step; null: "reduce-overhead" on GPUs (CUDA graphs),
    # "default" on CPUs (there is no graph replay on a CPU)
    compile_mode: str | None = None
    # attention of a decode step (one query token) in an SDPA model: matmul (two matmuls,
    # rlsys/models/attention.py), sdpa (torch's kernel), auto: matmul on CPUs, sdpa on GPUs
    decode_attention: str = "auto"
    # prefill each prompt once for its n samples (the KV cache copied to each sample's row),
    # and the head all the prompts of a micro-batch share once for all of them
    share_prefill: bool = True
    # rows that ended leave the decode batch (rlsys's loop, not transformers' generate)
    shrink_batch: bool = True
    # that loop's KV cache grows in place (room kept for the tokens to come), not by
    # concatenation every step
    cache_in_place: bool = True
    # CPU: linear weights prepacked for oneDNN once per weight version
    prepack: bool = True
    # with prepack: q/k/v and gate/up packed as one weight each, one call per group
    fuse_linears: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile={self.compile!r} must be true or false")
        for key in ("share_prefill", "shrink_batch", "cache_in_place", "prepack", "fuse_linears"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}={getattr(self, key)!r} must be true or false")
        if self.compile_mode is not None and self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode={self.compile_mode!r} must be one of {COMPILE_MODES}")
        if self.decode_attention not in DECODE_ATTENTION:
            raise ValueError(
                f"decode_attention={self.decode_attention!r} must be one of {DECODE_ATTENTION}"
            )

    def matmul_decode(self, device_type: str) -> bool:
        """Whether decode steps run as matmuls on a ``device_type`` engine."""
        if self.decode_attention == "auto":
            return device_type == "cpu"
        return self.decode_attention == "matmul"
