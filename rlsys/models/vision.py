"""Images into a vision-language policy (Qwen2-VL / Qwen2.5-VL style): which models take
images, their image processor, and the prompt text with each image's placeholder tokens.

A prompt's images become ``PromptPixels`` (the processor's patches and their (t, h, w) grid)
once, when the prompt is encoded; its text gets ``<|vision_start|>`` + one ``<|image_pad|>``
per merged patch + ``<|vision_end|>`` per image, in front of the text. The engine and the
learner both feed ``pixel_values`` and ``image_grid_thw`` with those ids to the model, which
puts the vision tower's features where the pad tokens are.
"""

from __future__ import annotations

import json
import os

import numpy as np

from rlsys.data.images import load_image
from rlsys.types import Prompt, PromptPixels

VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = (
    "<|vision_start|>",
    "<|image_pad|>",
    "<|vision_end|>",
    "<|video_pad|>",
)
VISION_TOKENS = [VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD]
VISION_PREFIX = "model.visual."  # the vision tower's parameter names (transformers 5)
SUPPRESS_KEY = "suppress_token_ids"  # in vision_inputs: the logits to mask (not a model input)


def vision_inputs(config, input_ids, pixels: list[PromptPixels | None], device=None) -> dict:
    """The model's image keyword arguments for a batch ``input_ids`` (B, T) whose row i shows
    ``pixels[i]``: ``pixel_values`` (sum N_i, D) and ``image_grid_thw`` (sum I_i, 3), rows in
    order (the model fills the batch's image pad tokens in that order), and
    ``mm_token_type_ids`` (B, T) (1 on image tokens: without it transformers 5 gives the
    image tokens text positions in ``generate`` and refuses a forward pass); {} when no row
    has images. ``config``: the model's (its image and video token ids)."""
    import torch

    shown = [p for p in pixels if p is not None]
    if not shown:
        return {}
    types = (input_ids == config.image_token_id).int()
    return {
        "mm_token_type_ids": types.to(device),
        SUPPRESS_KEY: torch.tensor(vision_token_ids(config), dtype=torch.long, device=device),
        "pixel_values": torch.from_numpy(np.concatenate([p.pixel_values for p in shown])).to(
            device
        ),
        "image_grid_thw": torch.from_numpy(np.concatenate([p.image_grid_thw for p in shown])).to(
            device
        ),
    }


def vision_token_ids(config) -> list[int]:
    """A VL model's placeholder tokens (image/video pad, vision start/end) that it must never
    generate: a reply holding one would not match the images given. Engines and learners
    both give them probability 0 (logit -inf), so their log-probabilities agree; [] for a
    text model."""
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    found = [getattr(config, n, None) for n in names]
    return sorted({int(i) for i in found if i is not None})


def is_vision_model(path: str) -> bool:
    """Whether the model directory ``path`` holds a vision-language model (its config.json
    has a ``vision_config``); False for hub ids and unreadable configs."""
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            return "vision_config" in json.load(fh)
    except (OSError, ValueError):
        return False


class ImageEncoder:
    """The image processor saved with a VL model, and what a prompt's images become."""

    def __init__(self, model_path: str) -> None:
        from transformers import AutoImageProcessor

        self.processor = AutoImageProcessor.from_pretrained(model_path)
        self.merge = int(getattr(self.processor, "merge_size", 1))

    def pixels(self, prompt: Prompt) -> PromptPixels:
        """The processed images of ``prompt`` (drawn or read now)."""
        images = [load_image(src, f"prompt {prompt.uid}'s image") for src in prompt.images]
        out = self.processor(images=images, return_tensors="np")
        return PromptPixels(
            np.asarray(out["pixel_values"], dtype=np.float32),
            np.asarray(out["image_grid_thw"], dtype=np.int64),
        )

    def text(self, text: str, pixels: PromptPixels) -> str:
        """``text`` after one placeholder block per image (one pad token per merged patch)."""
        blocks = [
            VISION_START + IMAGE_PAD * (int(np.prod(grid)) // self.merge**2) + VISION_END
            for grid in pixels.image_grid_thw
        ]
        return "".join(blocks) + text
