"""Reward-model scoring on Ray actors (inference-only learner groups): ensembles, batching,
left truncation, sharding over 2 ranks, bad paths."""

from __future__ import annotations

import numpy as np
import pytest

from rlsys.config.errors import ConfigError
from rlsys.config.reward import RewardModelConfig
from rlsys.models.builtin import build_char_tokenizer, build_tiny_reward_model
from rlsys.models.reward_model import RewardModelLoadError, load_reward_model, render_pair
from rlsys.rewards.model import RewardModelScorer

MAX_LENGTH = 24  # tokens; the longer pairs below are truncated
PROMPTS = ["What is 2+2? ", "Name a colour. ", "Say hi. ", "Count: ", "x", "Add 13 and 29. "]
COMPLETIONS = ["4", "Blue, like the sky.", "hi!", "1 2 3 4 5 6 7 8 9 10 11", "yz", "It is 42."]
METAS = [{} for _ in PROMPTS]


@pytest.fixture(scope="module")
def rm_dirs(tmp_path_factory) -> list[str]:
    """Two tiny reward models with different random weights."""
    root = tmp_path_factory.mktemp("rms")
    return [str(build_tiny_reward_model(root / f"rm{seed}", seed=seed)) for seed in (0, 1)]


def start(paths: list[str], **kwargs) -> RewardModelScorer:
    # half a CPU per actor: an ensemble and a second scorer fit the 2-CPU test cluster
    cfg = RewardModelConfig(paths=paths, num_cpus=0.5, max_length=MAX_LENGTH, **kwargs)
    return RewardModelScorer(cfg)


@pytest.fixture(scope="module")
def mean_scorer(ray_cpu, rm_dirs):
    scorer = start(rm_dirs, ensemble="mean", batch_size=4)
    yield scorer
    scorer.shutdown()


def direct_scores(path: str, texts: list[str]) -> np.ndarray:
    """Each text scored alone (no padding, last MAX_LENGTH tokens) in this process with plain
    transformers (and the char tokenizer the built-in models use)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from rlsys.models.builtin import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    scores = []
    with torch.no_grad():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")["input_ids"][:, -MAX_LENGTH:]
            scores.append(model(input_ids=ids).logits[0, 0].item())
    return np.array(scores)


def per_model_scores(paths: list[str], prompts: list[str], completions: list[str]) -> np.ndarray:
    """(models, items) direct scores of ``prompt + completion``."""
    texts = [p + c for p, c in zip(prompts, completions, strict=True)]
    return np.stack([direct_scores(path, texts) for path in paths])


def test_mean_ensemble_matches_direct_scores(mean_scorer, rm_dirs):
    per_model = per_model_scores(rm_dirs, PROMPTS, COMPLETIONS)
    assert not np.allclose(per_model[0], per_model[1])  # the two models do differ
    scores = mean_scorer.score_batch(PROMPTS, COMPLETIONS, METAS)
    assert np.allclose(scores, per_model.mean(axis=0), atol=1e-5, rtol=0)


def test_min_ensemble_matches_direct_scores(ray_cpu, rm_dirs):
    per_model = per_model_scores(rm_dirs, PROMPTS, COMPLETIONS)
    scorer = start(rm_dirs, ensemble="min")
    try:
        scores = scorer.score_batch(PROMPTS, COMPLETIONS, METAS)
    finally:
        scorer.shutdown()
    assert np.allclose(scores, per_model.min(axis=0), atol=1e-5, rtol=0)


def test_batch_larger_than_batch_size_scores_as_one_at_a_time(mean_scorer):
    # 6 pairs of different lengths in padded batches of 4, against each pair alone
    batched = mean_scorer.score_batch(PROMPTS, COMPLETIONS, METAS)
    alone = [mean_scorer(p, c, {}) for p, c in zip(PROMPTS, COMPLETIONS, strict=True)]
    assert np.allclose(batched, alone, atol=1e-5, rtol=0)


def test_left_truncation_keeps_the_completion_end(mean_scorer, rm_dirs):
    completion = "so, after all that, the final answer is 42."  # longer than MAX_LENGTH
    prompts = ["A long preamble that will be cut. ", "Another opening, also cut away. "]
    scores = mean_scorer.score_batch(prompts, [completion, completion], [{}, {}])
    # only the completion's last MAX_LENGTH tokens remain, whatever the prompt
    expected = per_model_scores(rm_dirs, [""], [completion]).mean(axis=0)[0]
    assert np.allclose(scores, [expected, expected], atol=1e-5, rtol=0)


def test_missing_path_names_the_key(ray_cpu, tmp_path):
    missing = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"reward\.model\.paths\[0\]") as info:
        start([missing])
    assert missing in str(info.value)


def test_a_reward_model_sharded_over_two_ranks_scores_like_the_plain_model(ray_cpu, rm_dirs):
    scorer = start(rm_dirs[:1], world_size=2)
    try:
        assert len(scorer.groups[0].workers) == 2
        scores = scorer.score_batch(PROMPTS, COMPLETIONS, METAS)
    finally:
        scorer.shutdown()
    expected = per_model_scores(rm_dirs[:1], PROMPTS, COMPLETIONS)[0]
    assert np.allclose(scores, expected, atol=1e-5, rtol=0)


def test_a_causal_lm_path_names_the_entry_and_why(ray_cpu, tiny_model_dir):
    with pytest.raises(ConfigError, match=r"paths\[0\].*not a sequence-classification model"):
        start([tiny_model_dir])


def test_causal_lm_is_not_a_reward_model(tiny_model_dir):
    # transformers would load it with a randomly initialised score head and no error
    with pytest.raises(RewardModelLoadError, match="not a sequence-classification model"):
        load_reward_model(tiny_model_dir)


def test_empty_paths_name_the_key():
    with pytest.raises(ConfigError, match=r"reward\.model\.paths is empty"):
        RewardModelScorer(RewardModelConfig())


def test_chat_rendering_only_with_a_template():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None  # as a base model's
    assert render_pair(tokenizer, "Q? ", "A.", chat=True) == "Q? A."  # no template: plain
    tokenizer.chat_template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    assert render_pair(tokenizer, "Q?", "A.", chat=True) == "[user]Q?[assistant]A."
    assert render_pair(tokenizer, "Q? ", "A.", chat=False) == "Q? A."
