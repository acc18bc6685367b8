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
    assert not engine._prepacked.weights  # their memory goes with the weights'
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
