"""The built-in tiny VL model and its pipeline pieces: tokenizer and image processor saved
and loaded offline, prompts encoded with their image tokens, image tensors kept with their
rows through collation and micro-batching, and engine log-probabilities equal to the
learner's formula (multimodal rotary positions included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlsys.config.errors import ConfigError
from rlsys.config.schema import RolloutConfig, ShapesConfig, TaskConfig
from rlsys.data.collate import samples_to_batch
from rlsys.data.shapes import shape_splits
from rlsys.engines.hf import HFEngine
from rlsys.models.loading import load_tokenizer
from rlsys.models.logprobs import greedy_next_tokens, token_logprobs
from rlsys.models.vision import IMAGE_PAD, is_vision_model, vision_inputs, vision_token_ids
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import PromptPixels, SamplingParams


@pytest.fixture(scope="module")
def prompts():
    train, _ = shape_splits(ShapesConfig(), 6, 1, seed=0)
    return train


def _collector(tokenizer, engine=None):
    generate = None if engine is None else lambda p, s, seed, b, im: engine.generate(p, s, b, im)
    return RolloutCollector.for_task(generate, tokenizer, TaskConfig(name="shapes"))


def test_saved_directory_round_trips(tiny_vl_dir):
    from transformers import AutoConfig

    assert is_vision_model(tiny_vl_dir)
    config = AutoConfig.from_pretrained(tiny_vl_dir)
    tok = load_tokenizer(tiny_vl_dir)
    assert tok.convert_tokens_to_ids(IMAGE_PAD) == config.image_token_id
    assert tok.encode("<|vision_start|>7", add_special_tokens=False) == [
        config.vision_start_token_id,
        tok.convert_tokens_to_ids("7"),
    ]
    assert tok.image_encoder is not None and tok.image_encoder.merge == 2
    assert len(vision_token_ids(config)) == 4


def test_prompts_encode_with_their_image_tokens(tiny_vl_dir, prompts):
    tok = load_tokenizer(tiny_vl_dir)
    kept, ids = _collector(tok).encode(prompts)
    pad = tok.convert_tokens_to_ids(IMAGE_PAD)
    for p, row in zip(kept, ids, strict=True):
        assert p.pixels.pixel_values.shape == (64, 3 * 2 * 7 * 7)  # 8 x 8 patches of 7 px
        assert p.pixels.image_grid_thw.tolist() == [[1, 8, 8]]
        assert row.count(pad) == 16  # merged 2 x 2
        assert tok.decode(row, skip_special_tokens=True) == p.text
    assert all(p.pixels is None for p in prompts)  # the originals stay small


def test_text_models_refuse_image_prompts(tiny_model_dir, prompts):
    with pytest.raises(ConfigError, match="vision-language model"):
        _collector(load_tokenizer(tiny_model_dir)).encode(prompts)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_engine_and_learner_agree_on_image_prompts(tiny_vl_dir, prompts, device):
    tok = load_tokenizer(tiny_vl_dir)
    engine = HFEngine(tiny_vl_dir, "float32", RolloutConfig(micro_batch_size=5), device)
    collector = _collector(tok, engine)
    groups = collector.generate(prompts, SamplingParams(n=3, max_new_tokens=4, seed=0))
    samples = [s for g in groups for s in g.samples]
    forbidden = set(vision_token_ids(engine.model.config))
    assert not any(t in forbidden for s in samples for t in s.completion.token_ids)
    batch = samples_to_batch(samples, tok.pad_token_id)
    # rows keep their own images through select (micro-batching): rows of a group share them
    assert batch.pixel_values.dtype == object and len(batch.pixel_values) == len(samples)
    rows = np.array([7, 0, 4])
    sub = batch.select(rows)
    for r, row in zip(rows, sub.pixel_values, strict=True):
        assert row is samples[r].prompt.pixels.pixel_values
    logp, entropy = _learner_pass(engine.model, sub, device, token_logprobs, entropy=True)
    mask = sub.loss_mask > 0
    np.testing.assert_allclose(logp.cpu().numpy()[mask], sub.behaviour_logprobs[mask], atol=1e-4)
    assert torch.isfinite(entropy).all()
    # greedy: the engine's reply is the learner's argmax token for token
    greedy = collector.generate(prompts, SamplingParams(greedy=True, max_new_tokens=4))
    check = samples_to_batch([g.samples[0] for g in greedy], tok.pad_token_id)
    argmax = _learner_pass(engine.model, check, device, greedy_next_tokens)
    mask = check.loss_mask > 0
    np.testing.assert_array_equal(argmax.cpu().numpy()[mask], check.input_ids[:, 1:][mask])


def _learner_pass(model, batch, device: str, fn, **kwargs):
    """``fn`` (token_logprobs or greedy_next_tokens) over ``batch`` with its images, as the
    learner calls it, on ``device``."""
    ids = torch.from_numpy(batch.input_ids).to(device)
    pixels = [
        PromptPixels(a, b) for a, b in zip(batch.pixel_values, batch.image_grid_thw, strict=True)
    ]
    vision = vision_inputs(model.config, ids, pixels, device)
    mask = torch.from_numpy(batch.attention_mask).to(device)
    with torch.no_grad():
        if fn is token_logprobs:
            return fn(model, ids, mask, vision=vision, **kwargs)
        return fn(model, ids, mask, vision, **kwargs)


def test_vllm_engine_refuses_vl_models_naming_the_fix(tiny_vl_dir):
    from rlsys.engines.vllm import VLLMEngine

    with pytest.raises(ValueError, match="rollout.engine=hf"):
        VLLMEngine(tiny_vl_dir, "float32", RolloutConfig(engine="vllm"))
