"""Attention functions registered with transformers for CPU learners and engines.

**fp32 attention in a bf16-autocast forward pass (learners).**

Under ``torch.autocast("cpu", torch.bfloat16)`` torch's CPU flash-attention kernel runs in bf16,
and its backward is slow: forward + backward of SmolLM2's attention shape (32 x 9 heads x
69 tokens x 64) took 41.6 ms in bf16 against 12.8 ms in fp32 on this project's 2-core Xeon
(AMX). The matmuls around it gain 4-9x from bf16, the attention kernel loses 3x, so the learner
runs attention in fp32 (q, k, v cast up, the output cast back): 3.4-5.7 s -> 2.6-3.2 s for a
SmolLM2 forward + backward of 32 sequences, with the same log-probabilities as bf16 attention
(mean |difference| to fp32 0.040 either way). GPUs keep their bf16 kernels.

**Decode steps as two matmuls (engines, ``rollout.engine_args.decode_attention``).** For one
query token SDPA's CPU flash kernel costs about 0.75 ms a layer call at SmolLM2's shapes (batch
16), a quarter of a bf16 decode step on this project's 2-core EPYC (docs/roofline.md); the
same attention as ``softmax(q k^T) v`` with the grouped query heads folded onto their key/value
head is cheaper there. Prefill (several query tokens) keeps SDPA.

Each name is registered with transformers' mask interface as well as its attention interface:
for an attention name it does not know, transformers builds no attention mask at all, so left
padding would be attended.
"""

from __future__ import annotations

import torch

FP32_SDPA = "rlsys_sdpa_fp32"  # the names registered with transformers' AttentionInterface
DECODE_MATMUL = "rlsys_decode_matmul"


def _register(name: str, function) -> None:
    """``function`` as attention ``name``, taking the boolean 4D masks SDPA takes."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)


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
    target = model if hasattr(model, "set_attn_implementation") else model.backbone
    if getattr(target.config, "_attn_implementation", None) not in ("sdpa", FP32_SDPA):
        return False
    _register(FP32_SDPA, _sdpa_fp32)
    target.set_attn_implementation(FP32_SDPA)  # a model that cannot switch only warns
    return target.config._attn_implementation == FP32_SDPA


def _decode_matmul(module, query, key, value, attention_mask, **kwargs):
    """SDPA's result for one query token as two matmuls; anything else goes to SDPA. Scores
    and softmax in fp32, as SDPA's kernels accumulate; the weights meet the values in their
    dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    plain = kwargs.get("dropout", 0.0) == 0.0 and kwargs.get("position_bias") is None
    if length != 1 or not plain or kwargs.get("cache") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kv_heads = key.shape[1]
    scale = kwargs.get("scaling") or dim**-0.5
    # query head h reads key/value head h // group (transformers' repeat_kv order); the
    # scores in fp32 from the start: a bf16 product would round them before the softmax
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim).float()
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * scale  # (B, KV, group, S)
    if attention_mask is not None:  # (B, 1, 1, S): bool (True attends) or additive
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights, value)  # (B, KV, group, value dim: MLA's differs from dim)
    return out.reshape(batch, 1, heads, value.shape[-1]), None


def use_decode_matmul(model: torch.nn.Module) -> bool:
    """Switch a text model that uses SDPA to SDPA with decode steps as matmuls (see the module
    docstring); False, leaving it as it is, for another implementation or a vision-language
    model (its vision tower shares the setting)."""
    config = model.config
    if config._attn_implementation != "sdpa" or getattr(config, "vision_config", None):
        return False
    _register(DECODE_MATMUL, _decode_matmul)
    model.set_attn_implementation(DECODE_MATMUL)
    return config._attn_implementation == DECODE_MATMUL
