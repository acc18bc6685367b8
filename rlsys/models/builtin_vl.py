"""The built-in tiny vision-language model: a randomly initialised transformers
``Qwen2VLForConditionalGeneration`` (a one-block vision tower, patch 7, spatial merge 2; the
text decoder of ``model.hidden_size`` etc.), the char tokenizer with Qwen2-VL's vision
tokens, and a ``Qwen2VLImageProcessor``, saved as an ordinary Hugging Face directory.

A 56 x 56 picture is 8 x 8 patches of 7 pixels, merged 2 x 2 into 16 image tokens.
"""

from __future__ import annotations

from pathlib import Path

from rlsys.config.schema import ModelConfig
from rlsys.models.saving import save_pretrained

PATCH_SIZE = 7  # pixels per patch side (Qwen2-VL: 14)
MERGE_SIZE = 2  # patches merged per side into one token (as Qwen2-VL)
VISION_WIDTH = 64  # the vision tower's embed dim (2 heads of 32)
VISION_DEPTH = 1  # vision transformer blocks
MIN_PIXELS, MAX_PIXELS = 28 * 28, 112 * 112  # the processor resizes pictures into this range


def vision_spec() -> list:
    """What the fingerprint of a built-in VL model covers beyond the text decoder."""
    return [PATCH_SIZE, MERGE_SIZE, VISION_WIDTH, VISION_DEPTH, MIN_PIXELS, MAX_PIXELS]


def build_vl_tokenizer():
    """The char tokenizer plus Qwen2-VL's vision tokens (special: never split)."""
    from rlsys.models.builtin import build_char_tokenizer
    from rlsys.models.vision import VISION_TOKENS

    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_TOKENS})
    return tokenizer


def build_image_processor():
    """A Qwen2-VL image processor for small pictures (no resizing of 56 or 84 px ones)."""
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor(
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
        min_pixels=MIN_PIXELS,
        max_pixels=MAX_PIXELS,
    )


def build_tiny_vl_model(cfg: ModelConfig, tokenizer, seed: int):
    """A randomly initialised Qwen2-VL with the text decoder of ``cfg``."""
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from rlsys.models.vision import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START

    # mrope: the rotary half of a head split over (t, h, w) as Qwen2-VL's 16/24/24 of 64
    half = cfg.hidden_size // cfg.num_heads // 2
    height = (half - half // 4) // 2
    sections = [half // 4, height, half - half // 4 - height]
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads,
            "num_key_value_heads": cfg.num_kv_heads,
            "max_position_embeddings": cfg.max_position_embeddings,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": sections,
            },
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": None,
            "tie_word_embeddings": cfg.tie_word_embeddings,
        },
        vision_config={
            "depth": VISION_DEPTH,
            "embed_dim": VISION_WIDTH,
            "hidden_size": cfg.hidden_size,
            "num_heads": VISION_WIDTH // 32,
            "mlp_ratio": 2,
            "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE,
            "temporal_patch_size": 2,
        },
        image_token_id=ids(IMAGE_PAD),
        video_token_id=ids(VIDEO_PAD),
        vision_start_token_id=ids(VISION_START),
        vision_end_token_id=ids(VISION_END),
        tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config)


def save_tiny_vl(cfg: ModelConfig, out_dir: str | Path, seed: int = 0) -> Path:
    """Build the tiny VL model, its tokenizer and image processor into ``out_dir``."""
    tokenizer = build_vl_tokenizer()
    model = build_tiny_vl_model(cfg, tokenizer, seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    save_pretrained(model, out_dir)
    tokenizer.save_pretrained(out_dir)
    build_image_processor().save_pretrained(out_dir)
    return Path(out_dir)
