"""Sequence-classification reward models: loading one (refusing a model with no trained
head), and the text and token ids it scores for a (prompt, completion) pair.
``rlsys.rewards.model.RewardModelScorer`` runs one per ``reward.model.paths`` entry as an
inference-only learner group; ``rlsys rm`` trains them."""

from __future__ import annotations

import os

import numpy as np

from rlsys.types import TrainBatch


class RewardModelLoadError(RuntimeError):
    """A ``reward.model.paths`` entry that does not load as a reward model."""


def uses_chat(tokenizer, chat: bool) -> bool:
    """Whether pairs are rendered with ``tokenizer``'s chat template: asked for, and it has one."""
    return chat and bool(getattr(tokenizer, "chat_template", None))


def render_pair(tokenizer, prompt: str, completion: str, chat: bool) -> str:
    """The text a reward model scores: a user/assistant chat in ``tokenizer``'s template
    (see ``uses_chat``), else ``prompt + completion``."""
    if not uses_chat(tokenizer, chat):
        return prompt + completion
    messages = [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": completion},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def reward_tokenizer(path: str):
    """The tokenizer of the reward model at ``path``, set up as it scores: right padding so
    the head reads the last real token, truncation from the left so the completion's end is
    kept, a pad token. Raises ``RewardModelLoadError`` for a path that has none."""
    from rlsys.models.loading import saved_tokenizer

    if (os.path.isabs(path) or path.startswith(".")) and not os.path.isdir(path):
        raise RewardModelLoadError("no such directory")
    try:
        tokenizer = saved_tokenizer(path)
    except (OSError, ValueError) as exc:
        raise RewardModelLoadError(f"{type(exc).__name__}: {exc}") from exc
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_reward_model(path: str, dtype: str = "float32"):
    """(tokenizer, model) at ``path`` (the tokenizer as ``reward_tokenizer`` sets it up);
    raises ``RewardModelLoadError`` for a path that is not a sequence-classification model."""
    import torch
    from transformers import AutoModelForSequenceClassification

    tokenizer = reward_tokenizer(path)
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=getattr(torch, dtype), output_loading_info=True
        )
    except (OSError, ValueError) as exc:
        raise RewardModelLoadError(f"{type(exc).__name__}: {exc}") from exc
    if info["missing_keys"]:
        # e.g. a causal LM: transformers would score with a randomly initialised head
        missing = ", ".join(sorted(info["missing_keys"]))
        raise RewardModelLoadError(
            f"it is not a sequence-classification model (no weights for {missing})"
        )
    if model.config.pad_token_id is None:
        # without it the head cannot find the last real token of a padded batch
        model.config.pad_token_id = tokenizer.pad_token_id
    return tokenizer, model.eval()


def encode_pairs(
    tokenizer, prompts: list[str], completions: list[str], chat: bool, max_length: int
) -> TrainBatch:
    """The batch a reward model scores: each pair rendered (``render_pair``), tokenized with
    the reward model's own tokenizer (``reward_tokenizer``), right-padded and truncated from
    the left to ``max_length`` tokens."""
    texts = [render_pair(tokenizer, p, c, chat) for p, c in zip(prompts, completions, strict=True)]
    inputs = tokenizer(
        texts,
        padding=True,
        truncation=True,
        max_length=max_length,
        # a chat template writes its own special tokens into the text
        add_special_tokens=not uses_chat(tokenizer, chat),
        return_tensors="np",
    )
    ids = inputs["input_ids"].astype(np.int64)
    none = np.zeros((len(texts), ids.shape[1] - 1), np.float32)  # no token is trained on
    return TrainBatch(ids, inputs["attention_mask"].astype(np.int64), none, none)
