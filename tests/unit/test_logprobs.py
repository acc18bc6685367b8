"""Response-only log-probabilities, whole or with the LM head in slices, equal the
full-vocabulary log-softmax they replace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlsys.data.collate import pack, position_ids
from rlsys.models import logprobs as lp
from rlsys.models.loading import load_model, load_tokenizer


@pytest.fixture(scope="module")
def model_and_batch(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+7=", "3+4=", "100+250=")]
    responses = [tok.encode(r, add_special_tokens=False) for r in ("19", "7 is it", "350")]
    batch = pack(prompts, responses, tok.pad_token_id)
    torch.manual_seed(0)
    return load_model(tiny_model_dir), batch


def _reference(model, ids, attention, temperature):
    """The full-vocabulary computation: log-softmax at every position, then gather."""
    logits = model(
        input_ids=ids, attention_mask=attention, position_ids=position_ids(attention)
    ).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    chosen = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return chosen, -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("slice_tokens", [None, 1, 5])  # None: the head on all at once
def test_response_positions_match_the_full_log_softmax(model_and_batch, slice_tokens):
    model, batch = model_and_batch
    ids = torch.from_numpy(batch.input_ids)
    attention = torch.from_numpy(batch.attention_mask)
    loss_mask = torch.from_numpy(batch.loss_mask)
    first = lp.first_scored(loss_mask)
    assert first == int(np.flatnonzero(batch.loss_mask.any(0))[0]) > 0
    want, want_entropy = _reference(model, ids, attention, 0.7)
    got, entropy = lp.token_logprobs(
        model, ids, attention, 0.7, first, entropy=True, slice_tokens=slice_tokens
    )
    assert got.shape == entropy.shape == want.shape
    torch.testing.assert_close(got[:, first:], want[:, first:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[:, first:], want_entropy[:, first:], atol=1e-5, rtol=1e-5)
    assert not got[:, :first].any() and not entropy[:, :first].any()
    assert not entropy.requires_grad  # a metric: no graph kept


@pytest.mark.parametrize("slice_tokens", [None, 4])
def test_gradients_match_the_full_log_softmax(model_and_batch, slice_tokens):
    """The loss's gradient through the selective log-probabilities (and an entropy bonus)
    equals the full computation's."""
    model, batch = model_and_batch
    ids = torch.from_numpy(batch.input_ids)
    attention = torch.from_numpy(batch.attention_mask)
    mask = torch.from_numpy(batch.loss_mask)
    weights = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape) * mask

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want, want_entropy = _reference(model, ids, attention, 1.0)
    expected = grads((want * weights).sum() + 0.1 * (want_entropy * mask).sum())
    got, entropy = lp.token_logprobs(
        model,
        ids,
        attention,
        1.0,
        lp.first_scored(mask),
        entropy=True,
        entropy_grad=True,
        slice_tokens=slice_tokens,
    )
    actual = grads((got * weights).sum() + 0.1 * (entropy * mask).sum())
    assert actual.keys() == expected.keys() and len(actual) > 0
    for name, grad in expected.items():
        torch.testing.assert_close(actual[name], grad, atol=1e-6, rtol=1e-4, msg=name)


def test_a_batch_with_nothing_to_train_runs_every_position(model_and_batch):
    """A dummy micro-batch (all-zero loss mask) still runs the whole model."""
    model, batch = model_and_batch
    assert lp.first_scored(torch.zeros(3, 7)) == 0
    ids = torch.from_numpy(batch.input_ids)
    got, none = lp.token_logprobs(model, ids, torch.from_numpy(batch.attention_mask), 1.0, 0)
    assert none is None and got.shape == (3, ids.shape[1] - 1) and got[:, 0].all()
