"""FLOPs and weight bytes of a decoder-only LM, counted from its config.

Model FLOPs as in the PaLM paper's MFU (Chowdhery et al. 2022, appendix B): a forward pass
costs 2 FLOPs per matmul weight per token (N, the non-embedding matmul weights, plus the LM
head where it runs) plus causal attention's two matmuls (QK^T and AV); backward costs twice
the forward, so training is 3x the forward (6N per token). Departures, all small: attention
is counted exactly for the causal mask (query i attends to i + 1 keys, sum T(T+1)/2 per
sequence) instead of PaLM's unmasked 12*L*H*Q*T per token; the LM head is counted only on
the positions it runs on (the learner computes response logits only: rlsys/models/logprobs.py;
an engine computes one per generated token); norms, biases, rotary embeddings, softmax and
the embedding lookup are left out, as is the recomputation of activation checkpointing (model
FLOPs, not hardware FLOPs). The MLP is the gated (SwiGLU) one of the Llama/Qwen/Mistral
families: three d x intermediate matrices.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


@dataclass(frozen=True)
class ModelShape:
    """The sizes that set a decoder-only LM's FLOPs."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_config(cls, config) -> ModelShape:
        """From a Hugging Face model config (a VL model's text config)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        missing = [k for k in _REQUIRED if getattr(text, k, None) is None]
        if missing:
            raise ValueError(
                f"model config {type(config).__name__} lacks {missing}: FLOPs are counted for "
                "decoder-only LMs of the Llama/Qwen kind (rlsys/perf/flops.py)"
            )
        heads = text.num_attention_heads
        return cls(
            layers=text.num_hidden_layers,
            hidden=text.hidden_size,
            heads=heads,
            kv_heads=getattr(text, "num_key_value_heads", None) or heads,
            head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
            intermediate=text.intermediate_size,
            vocab=text.vocab_size,
        )

    @classmethod
    def from_path(cls, model_path: str) -> ModelShape:
        """From a model directory's config.json (a VL model's ``text_config`` over its top
        level); without one, through ``transformers.AutoConfig``. The file is read directly:
        AutoConfig's first call costs seconds of imports on a 2-core CPU."""
        file = Path(model_path) / "config.json"
        if not file.is_file():
            from transformers import AutoConfig

            return cls.from_config(AutoConfig.from_pretrained(model_path))
        raw = json.loads(file.read_text())
        return cls.from_config(SimpleNamespace(**{**raw, **(raw.get("text_config") or {})}))

    @property
    def body_params(self) -> int:
        """N: the matmul weights of the decoder layers (q, k, v, o and the gated MLP)."""
        q_out = self.heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        attention = self.hidden * (q_out + 2 * kv_out) + q_out * self.hidden
        return self.layers * (attention + 3 * self.hidden * self.intermediate)

    @property
    def head_params(self) -> int:
        """The LM head's weights (tied to the embedding or not, the head reads them all)."""
        return self.vocab * self.hidden


def attention_flops(shape: ModelShape, length: int) -> float:
    """Forward FLOPs of causal attention's QK^T and AV over one sequence of ``length``:
    query i meets i + 1 keys, 2 x (heads x head_dim) multiply-adds each, in both matmuls."""
    return 2.0 * 2 * shape.layers * shape.heads * shape.head_dim * length * (length + 1) / 2


def forward_flops(shape: ModelShape, lengths: Iterable[int], head_positions: int) -> float:
    """Forward FLOPs over sequences of ``lengths`` tokens with the LM head on
    ``head_positions`` of their positions."""
    lengths = list(lengths)
    body = 2.0 * shape.body_params * sum(lengths)
    attention = sum(attention_flops(shape, t) for t in lengths)
    return body + attention + 2.0 * shape.head_params * head_positions


def generation_flops(
    shape: ModelShape, prompts: Iterable[int], rows: Iterable[tuple[int, int]], head_positions: int
) -> float:
    """Forward FLOPs of generating ``rows`` of (prompt, total) tokens whose distinct prompts have
    ``prompts`` tokens: each distinct prompt prefilled once (a group's samples share it, as
    both engines run it), each row's tokens after its prompt attending to everything before
    them, the LM head on ``head_positions`` (the replies' tokens)."""
    rows = list(rows)
    body = 2.0 * shape.body_params * (sum(prompts) + sum(total - prompt for prompt, total in rows))
    attention = sum(attention_flops(shape, t) for t in prompts)
    attention += sum(attention_flops(shape, t) - attention_flops(shape, p) for p, t in rows)
    return body + attention + 2.0 * shape.head_params * head_positions


def training_flops(shape: ModelShape, lengths: Iterable[int], head_positions: int) -> float:
    """Forward and backward FLOPs (backward is twice the forward): 6N per token and more."""
    return 3.0 * forward_flops(shape, lengths, head_positions)


def decode_weight_bytes(shape: ModelShape, dtype: str) -> int:
    """Bytes of weights one decode step reads at least: every matmul weight once (the
    embedding's lookup reads a row a sequence, left out), in the engine's ``dtype``."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPE_BYTES)}")
    return (shape.body_params + shape.head_params) * DTYPE_BYTES[dtype]
