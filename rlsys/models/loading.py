"""Load a policy and its tokenizer from a built-in name, a GGUF model, a local directory or a
hub id."""

from __future__ import annotations

from rlsys.config.schema import ModelConfig
from rlsys.models.builtin import (
    BUILTIN_PREFIX,
    build_char_tokenizer,
    builtin_dir,
    is_char_tokenizer,
)
from rlsys.models.gguf import GGUF_PREFIX, gguf_dir

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def resolve_model_path(cfg: ModelConfig) -> str:
    """A path or hub id that ``from_pretrained`` accepts (builds built-in models and converts
    GGUF models once, into the cache)."""
    if cfg.path.startswith(BUILTIN_PREFIX):
        return str(builtin_dir(cfg))
    if cfg.path.startswith(GGUF_PREFIX):
        return str(gguf_dir(cfg.path))
    return cfg.path


def load_tokenizer(path: str):
    """The tokenizer at ``path``, left-padding, with a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if is_char_tokenizer(tokenizer):
        # transformers loads a saved char tokenizer as the model type's tokenizer class
        # (Qwen2's), whose byte-level pre-tokenizer drops spaces: rebuild the real one
        tokenizer = build_char_tokenizer()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str, dtype: str = "float32"):
    """The causal LM at ``path`` in ``dtype``, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, _DTYPES[dtype]))
    except OSError as exc:
        raise FileNotFoundError(
            f"model.path={path!r} is neither a local Hugging Face directory nor a reachable "
            "hub id; pass a directory containing config.json, builtin:tiny or "
            "gguf:smollm2-135m-instruct"
        ) from exc
    return model.eval()
