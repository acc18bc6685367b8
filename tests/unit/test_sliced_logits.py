"""learner.logits_chunk_tokens: the LM head applied slice by slice (rlsys/models/lm_head.py)
gives the log-probabilities, entropies, argmax tokens and gradients of whole logits, holds one
slice's logits at a time (recomputed in backward), and works for LoRA adapters (on the head
too), recomputed decoder layers and a VL model; a model that changes its logits after the
head falls back to whole logits, with a warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from rlsys.config.schema import LoraConfig, ShapesConfig, TaskConfig
from rlsys.data.collate import pack
from rlsys.data.shapes import shape_splits
from rlsys.models import blocks, lora
from rlsys.models import lm_head as head_mod
from rlsys.models.loading import load_model, load_tokenizer
from rlsys.models.logprobs import first_scored, greedy_next_tokens, token_logprobs
from rlsys.models.vision import vision_inputs
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import PromptPixels

PROMPTS = ("12+7=", "3+4=", "100+250=", "9+9=")
RESPONSES = ("19", "7 is it", "350", "18 or so")


def _batch(tokenizer, prompts=PROMPTS, responses=RESPONSES):
    encode = tokenizer.encode
    batch = pack(
        [encode(p, add_special_tokens=False) if isinstance(p, str) else p for p in prompts],
        [encode(r, add_special_tokens=False) + [tokenizer.eos_token_id] for r in responses],
        tokenizer.pad_token_id,
    )
    return {
        "ids": torch.from_numpy(batch.input_ids),
        "attention": torch.from_numpy(batch.attention_mask),
        "mask": torch.from_numpy(batch.loss_mask),
    }


def _loss_and_grads(model, t, slice_tokens, vision=None):
    """An RL-shaped loss (weighted log-probabilities plus an entropy bonus, temperature 0.7)
    through ``token_logprobs`` with ``slice_tokens``: its values and every gradient."""
    mask = t["mask"]
    weights = torch.linspace(-1.0, 1.0, mask.numel()).reshape(mask.shape) * mask
    model.zero_grad(set_to_none=True)
    logp, entropy = token_logprobs(
        model,
        t["ids"],
        t["attention"],
        0.7,
        first_scored(mask),
        entropy=True,
        entropy_grad=True,
        vision=vision,
        slice_tokens=slice_tokens,
    )
    loss = (logp * weights).sum() + 0.1 * (entropy * mask).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), loss.detach(), grads


def _assert_same(got, want):
    for a, b in zip(got[:3], want[:3], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert got[3].keys() == want[3].keys() and len(want[3]) > 0
    # The head's weight gradient is summed slice by slice, in another order than one matmul
    # sums it: a tied embedding's entries (up to ~12) differed by 2.9e-6 on a Zen 3 EPYC (AVX2)
    for name, grad in want[3].items():
        torch.testing.assert_close(got[3][name], grad, atol=1e-5, rtol=1e-5, msg=name)


class HeadSpy:
    """Wraps a head's forward: the positions of every call, and whether it ran in backward."""

    def __init__(self, head: torch.nn.Module) -> None:
        self.rows: list[int] = []
        self.in_backward = 0
        plain = head.forward

        def forward(x):
            self.rows.append(x.reshape(-1, x.shape[-1]).shape[0])
            self.in_backward += torch._C._current_graph_task_id() != -1
            return plain(x)

        head.forward = forward


@pytest.fixture(scope="module")
def text(tiny_model_dir):
    return _batch(load_tokenizer(tiny_model_dir))


@pytest.mark.parametrize("slice_tokens", [1, 7])
def test_slices_give_the_whole_logits_loss_and_gradients(tiny_model_dir, text, slice_tokens):
    model = load_model(tiny_model_dir)
    want = _loss_and_grads(model, text, None)
    spy = HeadSpy(model.get_output_embeddings())
    got = _loss_and_grads(model, text, slice_tokens)
    _assert_same(got, want)
    positions = text["ids"].shape[0] * (text["ids"].shape[1] - first_scored(text["mask"]))
    slices = -(-positions // slice_tokens)
    # one slice's logits at a time, each computed in forward and again in backward
    assert max(spy.rows) <= slice_tokens and len(spy.rows) == 2 * slices
    assert spy.in_backward == slices


def test_forward_passes_and_greedy_tokens_match_without_a_graph(tiny_model_dir, text):
    model = load_model(tiny_model_dir)
    with torch.no_grad():
        logits = model(input_ids=text["ids"], attention_mask=text["attention"]).logits
        whole = token_logprobs(model, text["ids"], text["attention"], 1.0, 0, entropy=True)
        spy = HeadSpy(model.get_output_embeddings())
        sliced = token_logprobs(
            model, text["ids"], text["attention"], 1.0, 0, entropy=True, slice_tokens=5
        )
        argmax = greedy_next_tokens(model, text["ids"], text["attention"], slice_tokens=3)
    torch.testing.assert_close(sliced[0], whole[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sliced[1], whole[1], atol=1e-6, rtol=1e-5)
    assert max(spy.rows) <= 5 and spy.in_backward == 0
    # greedy picks from the same logits (attention-masked pad columns aside)
    real = text["attention"][:, 1:].bool()
    assert torch.equal(argmax[real], logits[:, :-1].argmax(-1)[real])


def test_lora_adapters_on_the_head_and_recomputed_layers_slice_too(tiny_model_dir, text):
    cfg = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "down_proj", "lm_head"])
    model = lora.add_adapters(load_model(tiny_model_dir), cfg)
    with torch.no_grad():  # B starts at 0: random, so the adapters change the output
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    blocks.checkpoint_layers(model)
    want = _loss_and_grads(model, text, None)
    got = _loss_and_grads(model, text, 6)
    _assert_same(got, want)
    assert any("lm_head.lora_B" in name for name in got[3])  # the head's adapter trains


def test_a_vl_model_slices_with_its_images(tiny_vl_dir):
    tokenizer = load_tokenizer(tiny_vl_dir)
    prompts, _ = shape_splits(ShapesConfig(), 3, 1, seed=0)
    collector = RolloutCollector.for_task(None, tokenizer, TaskConfig(name="shapes"))
    kept, ids = collector.encode(prompts)
    t = _batch(tokenizer, ids, ["red", "a blue one", "two"])
    model = load_model(tiny_vl_dir)
    pixels = [PromptPixels(p.pixels.pixel_values, p.pixels.image_grid_thw) for p in kept]
    vision = vision_inputs(model.config, t["ids"], pixels)
    want = _loss_and_grads(model, t, None, vision)
    got = _loss_and_grads(model, t, 4, vision)
    _assert_same(got, want)
    assert np.isfinite(got[0].numpy()).all()


def test_a_model_that_changes_its_logits_falls_back_to_whole_ones(tiny_model_dir, text, caplog):
    """As Gemma-2 soft-caps or Cohere scales logits after the head: the sliced values would
    be changed instead, so the call notices, warns and computes from whole logits."""
    model = load_model(tiny_model_dir)

    def scaled(module, args, kwargs, out):
        out.logits = out.logits * 0.5
        return out

    model.register_forward_hook(scaled, with_kwargs=True)
    with torch.no_grad():
        logits = model(input_ids=text["ids"], attention_mask=text["attention"]).logits
        want = torch.log_softmax(logits[:, :-1].float(), -1)
        want = want.gather(-1, text["ids"][:, 1:, None]).squeeze(-1)
        with caplog.at_level(logging.WARNING, logger=head_mod.__name__):
            got, _ = token_logprobs(model, text["ids"], text["attention"], 1.0, 0, slice_tokens=4)
        again, _ = token_logprobs(model, text["ids"], text["attention"], 1.0, 0, slice_tokens=4)
    assert "changes its LM head's output" in caplog.text
    assert getattr(model.get_output_embeddings(), head_mod._WHOLE)  # remembered
    real = text["attention"][:, 1:].bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, got)


@pytest.mark.parametrize("slice_tokens", [None, 7])
def test_an_fsdp2_model_returns_no_view_of_the_sliced_head(
    tiny_model_dir, text, slice_tokens, one_rank
):
    """FSDP2 hooks its backward on the root's outputs and warns (torch 2.13) of any that is a
    view: the head's (B, T, k) must be a tensor of its own, one slice or many."""
    import warnings

    from torch.distributed.fsdp import fully_shard

    model = load_model(tiny_model_dir, "float32")
    fully_shard(model)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = _loss_and_grads(model, text, slice_tokens)
    views = [str(w.message) for w in seen if "returned a view tensor" in str(w.message)]
    assert views == [] and len(got[3]) > 0
