"""Pack prompts and responses into padded ``TrainBatch`` arrays."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rlsys.types import PromptPixels, RolloutGroup, Sample, TrainBatch, Turn


def pack(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_id: int,
    response_logprobs: Sequence[Sequence[float]] | None = None,
    response_masks: Sequence[Sequence[int] | None] | None = None,
) -> TrainBatch:
    """Left-pad prompts and right-pad responses to one (B, T) layout.

    The loss mask covers exactly the response tokens (times ``response_masks[i]`` where given:
    0 on environment tokens of a multi-turn trajectory); behaviour logprobs (if given) land on
    the same positions, so entry t of every (B, T-1) array scores ``input_ids[:, t + 1]``.
    """
    batch = len(prompt_ids)
    p_len = max(len(p) for p in prompt_ids)
    r_len = max(max((len(r) for r in response_ids), default=0), 1)
    width = p_len + r_len
    input_ids = np.full((batch, width), pad_id, dtype=np.int64)
    attention = np.zeros((batch, width), dtype=np.int64)
    loss_mask = np.zeros((batch, width - 1), dtype=np.float32)
    behaviour = np.zeros((batch, width - 1), dtype=np.float32)
    for i, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        start = p_len - len(prompt)
        input_ids[i, start:p_len] = prompt
        input_ids[i, p_len : p_len + len(response)] = response
        attention[i, start : p_len + len(response)] = 1
        # Target index t+1 = p_len + j  ->  logprob index p_len - 1 + j.
        masks = response_masks[i] if response_masks is not None else None
        loss_mask[i, p_len - 1 : p_len - 1 + len(response)] = 1.0 if masks is None else masks
        if response_logprobs is not None:
            behaviour[i, p_len - 1 : p_len - 1 + len(response)] = response_logprobs[i]
    return TrainBatch(input_ids, attention, loss_mask, behaviour)


def samples_to_batch(samples: Sequence[Sample], pad_id: int) -> TrainBatch:
    """A TrainBatch of scored samples, with rewards and versions filled in, and reference
    log-probabilities when every sample carries them (scored as it arrived)."""
    batch = pack(
        [s.prompt_ids for s in samples],
        [s.completion.token_ids for s in samples],
        pad_id,
        [s.completion.logprobs for s in samples],
        [s.completion.mask for s in samples],
    )
    attach_pixels(batch, [s.prompt.pixels for s in samples])
    batch.rewards = np.array([s.reward for s in samples], dtype=np.float32)
    batch.versions = np.array([s.completion.version for s in samples], dtype=np.int64)
    if samples and all(s.ref_logprobs is not None for s in samples):
        batch.ref_logprobs = np.zeros_like(batch.behaviour_logprobs)
        for row, (sample, mask) in enumerate(zip(samples, batch.loss_mask, strict=True)):
            batch.ref_logprobs[row, mask > 0] = sample.ref_logprobs
    return batch


def attach_pixels(batch: TrainBatch, pixels: Sequence[PromptPixels | None]) -> TrainBatch:
    """Give ``batch`` row i's images ``pixels[i]`` (VL models; see ``TrainBatch``); nothing
    when no row has any. Rows of one prompt share its arrays (no copies)."""
    if all(p is None for p in pixels):
        return batch
    batch.pixel_values = np.empty(len(pixels), dtype=object)
    batch.image_grid_thw = np.empty(len(pixels), dtype=object)
    for i, p in enumerate(pixels):
        if p is not None:
            batch.pixel_values[i], batch.image_grid_thw[i] = p.pixel_values, p.image_grid_thw
    return batch


def batch_turns(groups: Sequence[RolloutGroup]) -> list[list[Turn] | None] | None:
    """(B,) the model turns of every sample of ``groups`` (in batch order), ``start`` / ``end``
    moved to the (B, T-1) columns of ``samples_to_batch`` (``pack``'s layout: token j of a
    response is column longest prompt - 1 + j); None when no sample has turns (single-turn)."""
    samples = [s for g in groups for s in g.samples]
    if not any(s.completion.turns for s in samples):
        return None
    offset = max(len(s.prompt_ids) for s in samples) - 1
    return [
        None
        if s.completion.turns is None
        else [
            dataclasses.replace(t, start=t.start + offset, end=t.end + offset)
            for t in s.completion.turns
        ]
        for s in samples
    ]


def position_ids(attention_mask):
    """Positions counted over real tokens only (matches HF generate with left padding)."""
    return (attention_mask.cumsum(-1) - 1).clip(min=0)
