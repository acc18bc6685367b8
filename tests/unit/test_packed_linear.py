"""A CPU engine's prepacked linear weights (``rollout.engine_args.prepack``, on by default):
the same replies and log-probabilities as ``F.linear``'s, weights packed again after a load
(copied or adopted) and after sleep, and ``F.linear`` wherever a gradient is wanted."""

from __future__ import annotations

import pytest
import torch

from rlsys.config.schema import RolloutConfig
from rlsys.engines.hf import HFEngine
from rlsys.engines.packed_linear import can_prepack
from rlsys.engines.settings import HFSettings
from rlsys.types import SamplingParams

PROMPTS = [[5, 6, 7, 8], [9, 10], [11, 12, 13]]


def _engine(tiny_model_dir, dtype: str, prepack: bool) -> HFEngine:
    return HFEngine(tiny_model_dir, dtype, RolloutConfig(), settings=HFSettings(prepack=prepack))


def _replies(engine: HFEngine, seed: int | None = None):
    sampling = SamplingParams(n=2, greedy=seed is None, max_new_tokens=8, seed=seed)
    return [c for group in engine.generate(PROMPTS, sampling) for c in group]


def _same(got, want, atol: float) -> None:
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for mine, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(
            torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=atol, rtol=0
        )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_replies_equal_plain_ones(tiny_model_dir, dtype):
    packed, plain = _engine(tiny_model_dir, dtype, True), _engine(tiny_model_dir, dtype, False)
    if not can_prepack(plain.model):
        # oneDNN cannot pack this dtype here (bfloat16 on a CPU without avx512_bf16, such as
        # a Zen 3 EPYC): the engine asked to prepack declines and runs F.linear, same replies
        assert packed._prepacked is None
        _same(_replies(packed), _replies(plain), 0)
        return
    assert packed._prepacked is not None and plain._prepacked is None
    atol = 1e-5 if dtype == "float32" else 0.02
    _same(_replies(packed), _replies(plain), atol)  # greedy
    _same(_replies(packed, seed=3), _replies(plain, seed=3), atol)  # sampled, same draws
    assert packed._prepacked.packed  # the calls did use packed weights


def test_weights_are_packed_again_after_a_load_or_sleep(tiny_model_dir):
    engine = _engine(tiny_model_dir, "float32", True)
    if engine._prepacked is None:
        pytest.skip("oneDNN cannot pack float32 on this CPU")
    before = _replies(engine)
    state = {n: t.detach().clone() for n, t in engine.model.state_dict().items()}
    changed = {n: t * 1.5 if t.is_floating_point() else t for n, t in state.items()}
    reference = _engine(tiny_model_dir, "float32", False)
    reference.update_weights([changed], 1)
    for adopt in (False, True):  # a copying transport, and a zero-copy one
        engine.update_weights([state], 1)
        assert _replies(engine)[0].token_ids == before[0].token_ids
        engine.update_weights([{n: t.clone() for n, t in changed.items()}], 2, adopt=adopt)
        assert not engine._prepacked.packed
        _same(_replies(engine), _replies(reference), 1e-5)
    engine.sleep()
    packed = engine._prepacked  # their memory goes with the weights', fused groups' too
    assert not packed.packed and not packed.weights
    assert packed.groups and all(g.weight is None for g in packed.groups)
    engine.wake()
    _same(_replies(engine), _replies(reference), 1e-5)


def test_a_call_with_gradients_uses_the_plain_weights(tiny_model_dir):
    engine = _engine(tiny_model_dir, "float32", True)
    if engine._prepacked is None:
        pytest.skip("oneDNN cannot pack float32 on this CPU")
    _replies(engine)
    ids = torch.tensor([PROMPTS[0]])
    logits = engine.model(input_ids=ids).logits
    assert logits.requires_grad
    logits.sum().backward()
    trainable = [p for p in engine.model.parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None for p in trainable)


class _Siblings(torch.nn.Module):
    """q/k/v and gate/up layers as a transformers decoder layer names them (q/k/v biased,
    as Qwen2's)."""

    def __init__(self, width: int, heads: int, kv: int, mlp: int) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(width, heads)
        self.k_proj = torch.nn.Linear(width, kv)
        self.v_proj = torch.nn.Linear(width, kv)
        self.gate_proj = torch.nn.Linear(width, mlp, bias=False)
        self.up_proj = torch.nn.Linear(width, mlp, bias=False)
        self.o_proj = torch.nn.Linear(width, 24)  # no sibling: packed alone


SHAPES = {  # (width, q, k/v, mlp), input (batch, tokens)
    "toy": ((32, 48, 16, 64), (2, 3)),
    "smollm2-decode-16": ((576, 576, 192, 1536), (16, 1)),
    "smollm2-decode-8": ((576, 576, 192, 1536), (8, 1)),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_siblings_equal_their_own_packed_layers(dtype, shape):
    """Each sibling's output, whatever the order of the calls, equals its layer packed alone
    bit for bit; an output kept for a sibling is not handed to a call with another input, or
    with the same tensor changed in place since, and none is kept for an inference tensor."""
    from rlsys.engines.packed_linear import PackedLinears, sibling_groups

    torch.manual_seed(0)
    dims, rows = SHAPES[shape]
    model = _Siblings(*dims).to(dtype)
    if not can_prepack(model):
        pytest.skip(f"oneDNN cannot pack {dtype} on this CPU")
    names = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "o_proj")
    alone = _Siblings(*dims).to(dtype)
    alone.load_state_dict(model.state_dict())
    fused, single = PackedLinears(model, rows[0]), PackedLinears(alone, rows[0], fuse=False)
    assert [len(g.layers) for g in fused.groups] == [3, 2] and not single.groups
    assert len(sibling_groups(model)) == 2
    fused.pack(), single.pack()
    attention = fused.groups[0]
    x, y = (torch.randn(*rows, dims[0], dtype=dtype) for _ in range(2))

    def check(inputs, order):
        for name, z in zip(order, inputs, strict=True):
            got = getattr(model, name)(z)
            want = getattr(alone, name)(z)
            assert got.shape == want.shape == (*rows, getattr(model, name).out_features)
            assert torch.equal(got, want), name

    with torch.no_grad():
        model.q_proj(x)
        assert len(attention.kept) == 2  # k's and v's outputs, computed with q's
        model.k_proj(x), model.v_proj(x)
        assert not attention.kept  # claimed
        check([x] * 6, names)  # the decoder layer's order
        check([x] * 6, names[::-1])  # siblings before the first
        check([x, y, x, y, x, y], names)  # another input between siblings
        model.q_proj(x)
        x.mul_(2.0)  # changed in place after q_proj kept k's and v's outputs for it
        check([x, x], ("k_proj", "v_proj"))
        fused.forget()
        assert not any(g.kept for g in fused.groups)
    with torch.inference_mode():
        z = torch.randn(*rows, dims[0], dtype=dtype)
        check([z] * 6, names)
        assert not any(g.kept for g in fused.groups)  # an inference tensor has no version
    with torch.no_grad():
        assert fused.packed
        fused.drop()
        assert not fused.packed and all(g.weight is None and not g.kept for g in fused.groups)
        plain = torch.nn.functional.linear(x, model.k_proj.weight, model.k_proj.bias)
        torch.testing.assert_close(model.k_proj(x), plain)  # dropped: F.linear


def test_the_engine_fuses_each_decoder_layer_s_siblings(tiny_model_dir, monkeypatch):
    """The engine multiplies each decoder layer's q/k/v and gate/up once per forward, with
    the replies of the layers packed apart, and keeps nothing after a generate."""
    from rlsys.engines import packed_linear

    engine = _engine(tiny_model_dir, "float32", True)
    if engine._prepacked is None:
        pytest.skip("oneDNN cannot pack float32 on this CPU")
    layers = engine.model.config.num_hidden_layers
    assert [len(g.layers) for g in engine._prepacked.groups] == [3, 2] * layers
    unfused = HFEngine(
        tiny_model_dir, "float32", RolloutConfig(), settings=HFSettings(fuse_linears=False)
    )
    assert unfused._prepacked is not None and not unfused._prepacked.groups
    calls = []
    real = packed_linear._linear
    monkeypatch.setattr(packed_linear, "_linear", lambda *a: calls.append(1) or real(*a))
    fused_replies = _replies(engine)
    fused_calls, calls[:] = len(calls), []
    _same(fused_replies, _replies(unfused), 0)
    # per forward: 7 packed calls a decoder layer and the head apart, 4 and the head fused
    forwards = len(calls) // (7 * layers + 1)
    assert forwards > 0 and len(calls) == forwards * (7 * layers + 1)
    assert fused_calls == forwards * (4 * layers + 1)
    assert not any(g.kept for g in engine._prepacked.groups)
    _same(_replies(engine, seed=5), _replies(unfused, seed=5), 0)
