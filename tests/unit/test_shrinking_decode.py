"""The HF engine's own decode loop drops rows that ended from its batch
(``rollout.engine_args.shrink_batch``, on by default): the same greedy replies and
log-probabilities as transformers' ``generate``, sampled log-probabilities that are the model's
own for the prefix each row has, and a batch that does shrink."""

from __future__ import annotations

import pytest
import torch

from rlsys.config.schema import RolloutConfig
from rlsys.engines.hf import HFEngine
from rlsys.engines.settings import HFSettings
from rlsys.types import SamplingParams


def _engine(tiny_model_dir, shrink: bool, share: bool = True) -> HFEngine:
    rollout = RolloutConfig(micro_batch_size=7)  # a prompt's samples split across calls
    settings = HFSettings(shrink_batch=shrink, share_prefill=share)
    return HFEngine(tiny_model_dir, "float32", rollout, settings=settings)


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    from rlsys.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    texts = ["12+7=", "3+4=", "65+28=", "9+90="]  # lengths differ: left padding in each batch
    return [tok.encode(t, add_special_tokens=False) for t in texts]


def _stop_token(engine: HFEngine, prompts, sampling: SamplingParams) -> int:
    """A token the replies of ``sampling`` hold early in some rows and not in others, so that
    stopping at it ends rows at different steps."""
    replies = [c.token_ids for g in engine.generate(prompts, sampling) for c in g]
    counts: dict[int, int] = {}
    for reply in replies:
        for token in set(reply[1:4]):
            counts[token] = counts.get(token, 0) + 1
    return max((n, t) for t, n in counts.items() if n < len(replies))[1]


@pytest.mark.parametrize(
    "share, head",
    [(True, ""), (False, ""), (True, "sum: ")],
    ids=["shared-prefill", "per-row-prefill", "shared-head"],
)
def test_greedy_replies_equal_generates(tiny_model_dir, prompts, share, head):
    """``shared-head``: the prompts share a head, laid out before their padded remainders,
    in both loops (``generate`` from the prefilled cache too)."""
    from rlsys.models.loading import load_tokenizer

    prompts = (
        [load_tokenizer(tiny_model_dir).encode(head, add_special_tokens=False) + p for p in prompts]
        if head
        else prompts
    )
    shrinking, generating = _engine(tiny_model_dir, True, share), _engine(tiny_model_dir, False)
    sampling = SamplingParams(n=3, greedy=True, max_new_tokens=10)
    sampling.stop_token_ids = [_stop_token(generating, prompts, sampling)]
    budgets = [10, 4, 10, 7]  # a shorter budget than the micro-batch's longest
    got = [c for g in shrinking.generate(prompts, sampling, budgets) for c in g]
    want = [c for g in generating.generate(prompts, sampling, budgets) for c in g]
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    assert {c.finish_reason for c in got} == {"stop", "length"}
    for mine, theirs in zip(got, want, strict=True):
        torch.testing.assert_close(
            torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=1e-5, rtol=0
        )


def test_sampled_logprobs_are_the_models_and_the_batch_shrinks(tiny_model_dir, prompts):
    """Each sampled token's recorded log-probability is the model's, recomputed over the
    row's prompt and reply in one forward pass (so the KV cache, positions and mask of the
    rows left after each drop are right), and the decode steps' batches shrink."""
    engine = _engine(tiny_model_dir, True)
    sampling = SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=5, top_logprobs=2)
    sampling.stop_token_ids = [_stop_token(engine, prompts, sampling)]
    widths: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        groups = engine.generate(prompts, sampling)
    finally:
        hook.remove()
    decode_widths = widths[widths.index(7, 1) :]  # after the first call's prefill
    assert min(decode_widths) < 7, decode_widths
    reasons = {c.finish_reason for g in groups for c in g}
    assert reasons == {"stop", "length"}
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            full = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logits = engine.model(input_ids=full).logits[0, len(prompt) - 1 : -1]
            logp = torch.log_softmax(logits.float() / sampling.temperature, dim=-1)
            want = logp.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=0)
            assert len(c.top_logprobs) == len(c.token_ids)
            best = [alternatives[0][1] for alternatives in c.top_logprobs]
            torch.testing.assert_close(torch.tensor(best), logp.max(-1).values, atol=1e-4, rtol=0)


def test_an_abort_ends_every_row(tiny_model_dir, prompts):
    engine = _engine(tiny_model_dir, True)
    calls = []  # generate clears an earlier abort: set it from a forward hook mid-call

    def abort_on_third(*_):
        calls.append(1)
        if len(calls) == 3:
            engine.abort()

    hook = engine.model.register_forward_pre_hook(abort_on_third)
    try:
        groups = engine.generate(prompts[:1], SamplingParams(n=3, greedy=True, max_new_tokens=9))
    finally:
        hook.remove()
    # forward 1 prefills the shared prompt, forward 2 decodes token 1, forward 3 (the abort
    # set before it) decodes token 2 and every row ends there
    assert [len(c.token_ids) for c in groups[0]] == [2, 2, 2]
    assert {c.finish_reason for c in groups[0]} == {"abort"}


def test_shrink_batch_is_a_checked_engine_setting():
    with pytest.raises(ValueError, match="shrink_batch='yes' must be true or false"):
        HFSettings(shrink_batch="yes")
