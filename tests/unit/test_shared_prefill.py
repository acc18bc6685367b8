"""The HF engine prefills a prompt once for its ``n`` samples, and the head its prompts share once
for all of them (``rollout.engine_args.share_prefill``, on by default): the same replies and
log-probabilities as prefilling every sample's row, with one prefill row per distinct prompt
and one for the common head."""

from __future__ import annotations

import pytest
import torch

from rlsys.config.schema import RolloutConfig
from rlsys.engines.hf import HFEngine
from rlsys.engines.prefill import common_head, lay_out
from rlsys.engines.settings import HFSettings
from rlsys.types import SamplingParams


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """(sharing, not sharing) fp32 engines of the tiny model, 7 rows per ``generate`` call, so a
    call's rows split a prompt's samples across micro-batches."""
    rollout = RolloutConfig(micro_batch_size=7)
    return tuple(
        HFEngine(tiny_model_dir, "float32", rollout, settings=HFSettings(share_prefill=share))
        for share in (True, False)
    )


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    from rlsys.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    texts = ["12+7=", "3+4=", "65+28=", "9+90="]  # lengths differ: left padding in each batch
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.fixture(scope="module")
def headed(tiny_model_dir):
    """Prompts that share a head of 5 tokens, as a chat template's prompts share its system
    turn, with remainders of different lengths."""
    from rlsys.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    texts = ["sum: 12+7=", "sum: 3+4=", "sum: 65+28=", "sum: 9+90="]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("which", ["distinct", "headed"])
def test_shared_prefill_generates_what_per_row_prefill_does(
    engines, prompts, headed, greedy, which
):
    shared, per_row = engines
    prompts = headed if which == "headed" else prompts
    sampling = SamplingParams(n=3, greedy=greedy, temperature=1.0, max_new_tokens=8, seed=11)
    budgets = [8, 3, 8, 5]  # a shorter budget than the micro-batch's longest
    got = [c for g in shared.generate(prompts, sampling, budgets) for c in g]
    want = [c for g in per_row.generate(prompts, sampling, budgets) for c in g]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    for mine, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(
            torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=1e-5, rtol=0
        )
    if not greedy:  # the draws differ between a prompt's samples: the rows are not copies
        assert len({tuple(c.token_ids) for c in got}) > len(prompts)


def test_each_distinct_prompt_is_prefilled_once(engines, prompts):
    """The first forward of each micro-batch holds one row per distinct prompt in it, every
    token but the last; ``generate`` then starts from the cache (one token a row)."""
    shared, per_row = engines
    seen: dict[str, list[tuple[int, int]]] = {"shared": [], "per_row": []}
    hooks = [
        engine.model.register_forward_pre_hook(
            lambda _, args, kwargs, key=key: seen[key].append(tuple(kwargs["input_ids"].shape)),
            with_kwargs=True,
        )
        for engine, key in ((shared, "shared"), (per_row, "per_row"))
    ]
    try:
        sampling = SamplingParams(n=3, greedy=True, max_new_tokens=2)
        shared.generate(prompts, sampling)
        per_row.generate(prompts, sampling)
    finally:
        for hook in hooks:
            hook.remove()
    width = max(len(p) for p in prompts[:3])  # micro-batch 1: rows 0-6, prompts 0, 1 and 2
    # micro-batch 1: prefill of 3 distinct prompts, then generate's own two steps
    assert seen["shared"][:3] == [(3, width - 1), (7, 1), (7, 1)]
    assert seen["per_row"][0] == (7, width)  # every row prefilled


def test_a_common_head_is_prefilled_once_for_every_prompt(engines, headed):
    """One forward of the head in one row, one of the distinct remainders but their last
    tokens (left-padded after the head), then the decode steps one token a row."""
    shared, _ = engines
    head = common_head(headed)
    assert head == 5
    seen: list[tuple[int, int]] = []
    hook = shared.model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    try:
        shared.generate(headed, SamplingParams(n=3, greedy=True, max_new_tokens=2))
    finally:
        hook.remove()
    remainder = max(len(p) for p in headed[:3]) - head  # micro-batch 1: prompts 0, 1, 2
    assert seen[:4] == [(1, head), (3, remainder - 1), (7, 1), (7, 1)]


def test_the_layout_keeps_the_head_in_place_and_pads_the_remainders():
    ids, mask = lay_out([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 1, 2]], pad_id=0, head=2)
    assert ids.tolist() == [[5, 6, 0, 7, 8], [5, 6, 0, 0, 9], [5, 6, 7, 1, 2]]
    assert mask.tolist() == [[1, 1, 0, 1, 1], [1, 1, 0, 0, 1], [1, 1, 1, 1, 1]]
    assert common_head([[5, 6, 7, 8], [5, 6, 9], [5, 6, 7, 1, 2]]) == 2
    assert common_head([[5, 6, 7], [5, 6, 7]]) == 2  # each keeps its last token
    assert common_head([[1, 2], [3, 4]]) == 0
    assert lay_out([[1, 2], [3]], pad_id=9)[0].tolist() == [[1, 2], [9, 3]]  # left padding


def test_share_prefill_is_a_checked_engine_setting():
    with pytest.raises(ValueError, match="share_prefill='yes' must be true or false"):
        HFSettings(share_prefill="yes")
