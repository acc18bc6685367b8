"""rlsys's registered attention functions (rlsys/models/attention.py): the learner's fp32
SDPA keeps the padding mask, and the engine's decode steps as matmuls give SDPA's result."""

from __future__ import annotations

import pytest
import torch

from rlsys.config.errors import ConfigError
from rlsys.config.schema import RolloutConfig
from rlsys.engines import engine_settings
from rlsys.engines.hf import HFEngine
from rlsys.engines.settings import HFSettings
from rlsys.models.attention import (
    DECODE_MATMUL,
    FP32_SDPA,
    _decode_matmul,
    use_decode_matmul,
    use_fp32_attention,
)
from rlsys.types import SamplingParams

_SDPA = {"decode_attention": "sdpa"}  # the engine setting of the SDPA baseline


def _left_padded(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows of 9 tokens, the first two left-padded by 3 and 6: ids, mask, positions."""
    ids = torch.randint(1, vocab, (3, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    mask[1, :6] = 0
    return ids.masked_fill(mask == 0, 0), mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_fp32_attention_keeps_the_padding_mask(tiny_model_dir):
    """The learner's fp32 SDPA (bf16 learners on CPU) gives SDPA's logits on left-padded rows:
    transformers builds no mask for an attention name it does not know, and before the name
    was registered with its mask interface the real tokens attended the padding."""
    from rlsys.models.loading import load_model

    model = load_model(tiny_model_dir, "float32").eval()
    ids, mask, positions = _left_padded(model.config.vocab_size)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        assert use_fp32_attention(model)
        assert model.config._attn_implementation == FP32_SDPA
        got = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def _decode_inputs(dtype, scale: float = 1.0, value_dim: int = 16, seed: int = 0):
    """One query token over 3 key/value heads of 4 query heads each, 11 keys; ``scale`` makes
    the scores peaky (trained models' are)."""
    gen = torch.Generator().manual_seed(seed)
    batch, kv_heads, group, length, dim = 2, 3, 4, 11, 16
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = group, True
    query = (scale * torch.randn(batch, kv_heads * group, 1, dim, generator=gen)).to(dtype)
    key = (scale * torch.randn(batch, kv_heads, length, dim, generator=gen)).to(dtype)
    value = torch.randn(batch, kv_heads, length, value_dim, generator=gen).to(dtype)
    keep = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    keep[0, ..., :4] = False  # a left-padded row
    return module, query, key, value, keep


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_query_token_as_matmuls_is_sdpa(mask_kind, dtype):
    """For one query token over grouped key/value heads, the matmul form gives SDPA's output
    (transformers' own call, key/value heads repeated) for no mask, a boolean mask and an
    additive one, also with a value head size other than the query's (MLA); several query
    tokens go to SDPA itself."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for value_dim in (16, 8):
        module, query, key, value, keep = _decode_inputs(dtype, value_dim=value_dim)
        mask = {
            "none": None,
            "bool": keep,
            "additive": torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, -1e4),
        }[mask_kind]
        kwargs = {"scaling": query.shape[-1] ** -0.5, "dropout": 0.0}
        want, _ = sdpa_attention_forward(module, query, key, value, mask, **kwargs)
        got, weights = _decode_matmul(module, query, key, value, mask, **kwargs)
        assert got.shape == want.shape == (2, 1, 12, value_dim) and weights is None
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    prefill = torch.randn(2, 12, 3, 16).to(dtype)
    torch.testing.assert_close(
        _decode_matmul(module, prefill, key, value, None, **kwargs)[0],
        sdpa_attention_forward(module, prefill, key, value, None, **kwargs)[0],
    )


def test_bf16_scores_are_not_rounded_before_the_softmax():
    """On peaky bf16 scores (q and k 5x unit scale) the matmul form is as close as SDPA's kernel
    to attention computed in float64 from the same bf16 inputs: the scores are formed in fp32,
    not rounded to bf16 first (which made its error about 7x SDPA's)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    errors = {"sdpa": [], "matmul": []}
    for seed in range(4):
        module, query, key, value, keep = _decode_inputs(torch.bfloat16, scale=5.0, seed=seed)
        q = query.double().reshape(2, 3, 4, 16)
        scores = (q @ key.double().transpose(-1, -2)) / 4.0
        exact = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ value.double()
        exact = exact.reshape(2, 1, 12, 16)
        for name, fn in (("sdpa", sdpa_attention_forward), ("matmul", _decode_matmul)):
            out, _ = fn(module, query, key, value, keep, scaling=0.25, dropout=0.0)
            errors[name].append((out.double() - exact).abs().mean().item())
    sdpa, matmul = (sum(v) / len(v) for v in errors.values())
    assert matmul <= 1.5 * sdpa, errors


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_engine_decodes_with_matmuls_on_cpu_and_agrees_with_sdpa(tiny_model_dir, dtype):
    """A CPU engine decodes with matmuls by default (``decode_attention=auto``), and every
    decode step goes through them; greedy replies to prompts of different lengths (left-padded
    together) and their log-probabilities are the SDPA engine's, and so are seeded samples."""
    from transformers import AttentionInterface

    matmul = HFEngine(tiny_model_dir, dtype, RolloutConfig(), "cpu")
    sdpa = HFEngine(tiny_model_dir, dtype, RolloutConfig(), "cpu", HFSettings(**_SDPA))
    assert matmul.model.config._attn_implementation == DECODE_MATMUL
    assert sdpa.model.config._attn_implementation == "sdpa"
    one_token_calls = []

    def counted(module, query, *args, **kwargs):
        one_token_calls.append(query.shape[2] == 1)
        return _decode_matmul(module, query, *args, **kwargs)

    prompts = [[5, 9, 13], [7, 21, 8, 30, 11, 4, 19], [40]]
    tol = 1e-5 if dtype == "float32" else 2e-2
    AttentionInterface.register(DECODE_MATMUL, counted)
    try:
        for sampling in (
            SamplingParams(greedy=True, max_new_tokens=12),
            SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=3),
        ):
            got = [c for g in matmul.generate(prompts, sampling) for c in g]
            want = [c for g in sdpa.generate(prompts, sampling) for c in g]
            assert [c.token_ids for c in got] == [c.token_ids for c in want]
            for mine, theirs in zip(got, want, strict=True):
                torch.testing.assert_close(
                    torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=tol, rtol=0
                )
    finally:
        AttentionInterface.register(DECODE_MATMUL, _decode_matmul)
    assert sum(one_token_calls) >= 2 * 11  # 2 layers x the decode steps after the prefill


def test_a_vision_language_model_keeps_sdpa(tiny_vl_dir):
    """A vision-language model's vision tower shares its attention setting: it stays on SDPA."""
    from rlsys.models.loading import load_model

    model = load_model(tiny_vl_dir, "float32")
    assert not use_decode_matmul(model)
    assert model.config._attn_implementation == "sdpa"


def test_decode_attention_is_a_checked_engine_setting():
    assert engine_settings(RolloutConfig(engine_args=_SDPA)) == HFSettings(**_SDPA)
    assert HFSettings().matmul_decode("cpu") and not HFSettings().matmul_decode("cuda")
    assert HFSettings(decode_attention="matmul").matmul_decode("cuda")
    assert not HFSettings(**_SDPA).matmul_decode("cpu")
    with pytest.raises(ConfigError, match=r"rollout.engine_args: decode_attention='flash' must"):
        engine_settings(RolloutConfig(engine_args={"decode_attention": "flash"}))
