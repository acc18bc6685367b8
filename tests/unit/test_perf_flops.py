"""FLOPs and weight bytes counted from a model config (rlsys.perf.flops), worked by hand on a
tiny Llama, and checked against the parameters of the model the config builds."""

from __future__ import annotations

import json

import pytest
from transformers import LlamaConfig

from rlsys.perf.flops import (
    ModelShape,
    attention_flops,
    decode_weight_bytes,
    forward_flops,
    generation_flops,
    training_flops,
)

# hidden 64, 2 layers, 4 query heads and 2 key/value heads of 16, gated MLP of 128, vocab 100
TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=100,
)
# per layer: q 64x64 = 4096, k and v 64x32 = 2048 each, o 64x64 = 4096 -> attention 12288;
# MLP gate, up, down 3 x 64 x 128 = 24576 -> 36864 a layer, N = 2 x 36864 = 73728
N = 73728
HEAD = 100 * 64  # 6400


def test_shape_counts_the_matmul_weights_by_hand():
    shape = ModelShape.from_config(LlamaConfig(**TINY))
    assert (shape.head_dim, shape.kv_heads) == (16, 2)
    assert shape.body_params == N
    assert shape.head_params == HEAD


def test_shape_matches_the_model_the_config_builds():
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**TINY))
    linear = [m for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    shape = ModelShape.from_config(model.config)
    assert shape.body_params == sum(m.weight.numel() for m in linear)
    assert shape.head_params == model.lm_head.weight.numel()


def test_forward_and_training_flops_by_hand():
    shape = ModelShape.from_config(LlamaConfig(**TINY))
    # causal attention: 2 matmuls x 2 FLOPs x layers x (heads x head_dim = 64) x T(T+1)/2
    # = 256 T(T+1): 3 tokens -> 256 x 12 = 3072, 5 tokens -> 256 x 30 = 7680
    assert attention_flops(shape, 3) == 3072
    assert attention_flops(shape, 5) == 7680
    # body 2N x 8 tokens = 1179648; attention 10752; head on 4 response positions only:
    # 2 x 6400 x 4 = 51200
    assert forward_flops(shape, [3, 5], head_positions=4) == 1179648 + 10752 + 51200
    assert training_flops(shape, [3, 5], 4) == 3 * (1179648 + 10752 + 51200)
    # the head term follows the positions it runs on, not the sequence lengths
    assert forward_flops(shape, [3, 5], 8) - forward_flops(shape, [3, 5], 4) == 2 * HEAD * 4


def test_generation_flops_prefill_a_shared_prompt_once():
    shape = ModelShape.from_config(LlamaConfig(**TINY))  # N = 73728, 256 T(T+1) attention
    # two samples of one 3-token prompt, 5 and 6 tokens in all, 5 reply tokens: the prompt
    # once (2N x 3, attention 3072), then 2 + 3 tokens (2N x 5) attending to all before them
    # (7680 - 3072 and 10752 - 3072), the head on the 5 reply tokens (2 x 6400 x 5)
    got = generation_flops(shape, [3], [(3, 5), (3, 6)], head_positions=5)
    assert got == 2 * 73728 * 8 + 3072 + 4608 + 7680 + 64000
    # against prefilling each sample's row: one prompt's prefill less
    assert forward_flops(shape, [5, 6], 5) - got == 2 * 73728 * 3 + 3072


def test_per_token_training_flops_approach_6n():
    """One long sequence: per token, 6N + 6 x the head + causal attention's 6 L d (T+1)/2 ."""
    shape = ModelShape.from_config(LlamaConfig(**TINY))
    t = 1000
    per_token = training_flops(shape, [t], head_positions=t) / t
    assert per_token == pytest.approx(6 * (N + HEAD) + 6 * 2 * 64 * (t + 1))


def test_decode_weight_bytes():
    shape = ModelShape.from_config(LlamaConfig(**TINY))
    assert decode_weight_bytes(shape, "bfloat16") == (N + HEAD) * 2
    assert decode_weight_bytes(shape, "float32") == (N + HEAD) * 4
    with pytest.raises(ValueError, match="int8"):
        decode_weight_bytes(shape, "int8")


def test_a_config_without_the_fields_is_refused():
    from transformers import PretrainedConfig

    with pytest.raises(ValueError, match="intermediate_size"):
        ModelShape.from_config(PretrainedConfig(hidden_size=8))


def test_shape_from_a_model_directory(tmp_path):
    LlamaConfig(**TINY).save_pretrained(tmp_path / "llama")
    assert ModelShape.from_path(str(tmp_path / "llama")) == ModelShape.from_config(
        LlamaConfig(**TINY)
    )
    # a VL model's text sizes under text_config win over its top level
    vl = tmp_path / "vl"
    vl.mkdir()
    (vl / "config.json").write_text(json.dumps({"vocab_size": 7, "text_config": TINY}))
    assert ModelShape.from_path(str(vl)).body_params == N
