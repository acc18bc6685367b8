"""The decode loop's KV cache grows in place (rlsys/engines/kv_cache.py): the same keys and
values as transformers' dynamic layer through prefill, decode steps past its room, dropped
rows and a cache built before it, written without a copy of the cache per step; the engine's
replies and log-probabilities bit-equal to decoding on the dynamic cache."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from rlsys.config.schema import RolloutConfig
from rlsys.engines import kv_cache
from rlsys.engines.hf import HFEngine
from rlsys.engines.kv_cache import GrowingLayer, grow_in_place
from rlsys.engines.settings import HFSettings
from rlsys.types import SamplingParams


def _states(rows: int, tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(rows, 2, tokens, 4, generator=g)
    values = torch.randn(rows, 2, tokens, 3, generator=g)  # a head size of their own (MLA)
    return keys, values


def test_growing_layer_holds_what_the_dynamic_layer_holds(monkeypatch):
    monkeypatch.setattr(kv_cache, "CHUNK", 4)  # steps run past the room several times
    grown, plain = GrowingLayer(limit=12), DynamicLayer()
    updates = [(5, 5)] + [(5, 1)] * 2 + [(3, 1)] * 8  # prefill, steps, 2 rows dropped, steps
    rows = 5
    starts = []
    for step, (batch, tokens) in enumerate(updates):
        if batch < rows:
            keep = torch.tensor([0, 2, 4])
            grown.batch_select_indices(keep)
            plain.batch_select_indices(keep)
            rows = batch
            # the kept rows keep their room (9 columns, 7 filled): no fallback to a copy
            # without room, which the next step would have to reserve afresh
            assert grown._room[0].shape == (3, 2, 9, 4) and grown._views_room()
        k, v = _states(batch, tokens, step)
        got, want = grown.update(k, v), plain.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert grown.get_seq_length() == plain.get_seq_length()
        starts.append(got[0].data_ptr())
    assert grown.get_seq_length() == 15 and grown._room[0].shape[-2] == 13 + 4  # past limit
    # prefill reserved 9 columns (5 + CHUNK); the buffers moved at the drop (step 3, the kept
    # rows' one copy), when the 10th token outgrew them (step 5: 12 columns, the limit) and
    # past the limit (step 8, the 13th token: 13 + CHUNK); every other step wrote in place
    moved = [i + 1 for i, (a, b) in enumerate(zip(starts, starts[1:], strict=False)) if a != b]
    assert moved == [3, 5, 8]


def test_offload_and_reset_let_the_room_go():
    layer = GrowingLayer(limit=10)
    layer.update(*_states(2, 3, 0))
    layer.offload()
    assert layer._room is None and layer.keys.shape[-2] == 3
    k, v = _states(2, 1, 1)
    keys, _ = layer.update(k, v)  # room reserved afresh, the offloaded columns copied in
    assert keys.shape[-2] == 4 and torch.equal(keys[..., 3:, :], k) and layer._views_room()
    layer.reset()
    assert layer._room is None and layer.get_seq_length() == 0


def test_a_filled_dynamic_cache_is_taken_over(tiny_model_dir):
    from rlsys.models.loading import load_model

    model = load_model(tiny_model_dir, "float32")
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    grow_in_place(cache, limit=10)
    assert all(type(layer) is GrowingLayer for layer in cache.layers)
    for layer, (keys, values) in zip(cache.layers, before, strict=True):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
        assert layer._room[0].shape[-2] == 10
    assert cache.get_seq_length() == 4


def test_engine_replies_are_bit_equal_to_the_dynamic_caches(tiny_model_dir, monkeypatch):
    """``rollout.engine_args.cache_in_place=false`` decodes on transformers' dynamic cache."""
    rollout = RolloutConfig(micro_batch_size=6)
    grown, plain = (
        HFEngine(tiny_model_dir, "float32", rollout, settings=HFSettings(cache_in_place=on))
        for on in (True, False)
    )
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    sampling = SamplingParams(n=3, temperature=0.8, max_new_tokens=20, seed=3)
    budgets = [20, 7, 13]  # rows end at different steps: the batch drops rows between
    monkeypatch.setattr(kv_cache, "CHUNK", 8)  # and the cache fills past its first room
    written = []  # GrowingLayer.update calls while each engine decodes
    update = GrowingLayer.update

    def counted(layer, *args, **kwargs):
        written[-1] += 1
        return update(layer, *args, **kwargs)

    monkeypatch.setattr(GrowingLayer, "update", counted)
    replies = []
    for engine in (grown, plain):
        engine.eos_ids = set()  # every row runs its budget
        written.append(0)
        replies.append([c for g in engine.generate(prompts, sampling, budgets) for c in g])
    layers = grown.model.config.num_hidden_layers  # every layer, every decode step in place:
    assert written[0] >= layers * (max(budgets) - 1) and written[1] == 0  # not only prefill
    assert [c.token_ids for c in replies[0]] == [c.token_ids for c in replies[1]]
    assert [c.logprobs for c in replies[0]] == [c.logprobs for c in replies[1]]
    assert [len(c.token_ids) for c in replies[0]] == [b for b in budgets for _ in range(3)]


def test_cache_in_place_is_a_checked_engine_setting():
    with pytest.raises(ValueError, match="cache_in_place='no' must be true or false"):
        HFSettings(cache_in_place="no")
