"""The HF engine's sampler: draws from softmax(logits / T) (top-p truncated), hands the pick to
``generate`` and records the behaviour log-probability of the full tempered distribution."""

from __future__ import annotations

import torch

from rlsys.engines.hf import _Sampler, _top_p

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
