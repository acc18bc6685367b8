"""The HF engine's sampler: draws from softmax(logits / T) (top-p truncated), hands the pick to
``generate`` and records the behaviour log-probability of the full tempered distribution."""

from __future__ import annotations

import math

import pytest
import torch

from rlsys.engines.hf import _Sampler, _top_p, _top_pairs

ROWS = 40_000


def _draw(logits: torch.Tensor, temperature: float, top_p: float, greedy: bool = False):
    torch.manual_seed(0)
    sampler = _Sampler(temperature, top_p, greedy)
    scores = sampler(torch.zeros(ROWS, 1, dtype=torch.long), logits.repeat(ROWS, 1))
    chosen = scores.argmax(-1)
    return sampler, scores, chosen


def _frequencies(chosen: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(chosen, minlength=vocab).float() / len(chosen)


def test_samples_follow_the_tempered_distribution_and_record_its_logprobs():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]])
    for temperature in (1.0, 0.5):
        sampler, scores, chosen = _draw(logits, temperature, 1.0)
        want = torch.softmax(logits[0] / temperature, -1)
        torch.testing.assert_close(_frequencies(chosen, 5), want, atol=0.01, rtol=0)
        # generate sees exactly one finite score per row: the pick
        assert bool((scores.isfinite().sum(-1) == 1).all())
        logp = torch.log_softmax(logits[0] / temperature, -1)
        torch.testing.assert_close(sampler.logprobs[0], logp[chosen])


def test_top_p_keeps_the_smallest_head_reaching_the_mass():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])  # sorted: 0.5, 0.3 (0.8 >= 0.7), cut there
    kept = _top_p(probs.log(), 0.7).isfinite()
    assert kept.tolist() == [[False, True, False, True]]
    assert _top_p(probs.log(), 0.4).isfinite().tolist() == [[False, True, False, False]]
    sampler, _, chosen = _draw(probs.log(), 1.0, 0.7)
    want = torch.tensor([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8])
    torch.testing.assert_close(_frequencies(chosen, 4), want, atol=0.01, rtol=0)
    # the behaviour log-probability is of the untruncated distribution, as the learner's
    torch.testing.assert_close(sampler.logprobs[0], probs[0].log()[chosen])


def test_greedy_takes_the_argmax_at_temperature_one():
    logits = torch.tensor([[0.1, 3.0, 2.9]])
    sampler, _, chosen = _draw(logits, 0.3, 0.5, greedy=True)
    assert bool((chosen == 1).all())
    torch.testing.assert_close(sampler.logprobs[0], torch.log_softmax(logits[0], -1)[chosen])


def test_top_k_reports_the_likeliest_tokens_of_the_distribution_drawn_from():
    """``top_k`` (tree rollouts' iid mode): the k likeliest tokens per step with their
    behaviour logprobs; under top-p only the nucleus's (the tokens a draw can give)."""
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    sampler = _Sampler(1.0, 1.0, False, top_k=3)
    sampler(torch.zeros(2, 1, dtype=torch.long), probs.log().repeat(2, 1))
    values, ids = sampler.top[0]
    assert ids.tolist() == [[1, 3, 2]] * 2
    torch.testing.assert_close(values, probs.log()[0, [1, 3, 2]].repeat(2, 1))
    nucleus = _Sampler(1.0, 0.7, False, top_k=3)  # 0.5 + 0.3 reach 0.7: two tokens
    nucleus(torch.zeros(1, 1, dtype=torch.long), probs.log())
    values, ids = nucleus.top[0]
    assert ids[0, :2].tolist() == [1, 3] and values[0, 2] == float("-inf")
    ((pairs,),) = _top_pairs(nucleus.top, 1)  # the -inf one left out
    assert [t for t, _ in pairs] == [1, 3]
    assert [lp for _, lp in pairs] == pytest.approx([math.log(0.5), math.log(0.3)], abs=1e-6)
