"""Attention in fp32 inside a bf16-autocast forward pass, for CPU learners.

Under ``torch.autocast("cpu", torch.bfloat16)`` torch's CPU flash-attention kernel runs in bf16,
and its backward is slow: forward + backward of SmolLM2's attention shape (32 x 9 heads x
69 tokens x 64) took 41.6 ms in bf16 against 12.8 ms in fp32 on this project's 2-core Xeon
(AMX). The matmuls around it gain 4-9x from bf16, the attention kernel loses 3x, so the learner
runs attention in fp32 (q, k, v cast up, the output cast back): 3.4-5.7 s -> 2.6-3.2 s for a
SmolLM2 forward + backward of 32 sequences, with the same log-probabilities as bf16 attention
(mean |difference| to fp32 0.040 either way). GPUs keep their bf16 kernels.
"""

from __future__ import annotations

import torch

FP32_SDPA = "rlsys_sdpa_fp32"  # the name registered with transformers' AttentionInterface


def _sdpa_fp32(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(dtype), weights


def use_fp32_attention(model: torch.nn.Module) -> bool:
    """Switch a transformers model (or the critic's decoder, ``model.backbone``) that uses
    SDPA to SDPA in fp32 (see the module docstring); False, leaving it as it is, when it uses
    another implementation."""
    from transformers import AttentionInterface

    target = model if hasattr(model, "set_attn_implementation") else model.backbone
    if getattr(target.config, "_attn_implementation", None) not in ("sdpa", FP32_SDPA):
        return False
    AttentionInterface.register(FP32_SDPA, _sdpa_fp32)
    target.set_attn_implementation(FP32_SDPA)
    return True
