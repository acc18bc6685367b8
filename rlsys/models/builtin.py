"""Built-in tiny models: a Qwen2-style decoder from a config and an offline char tokenizer.

Nothing here touches a hub: the tokenizer is trained-free (one token per printable ASCII
character plus special tokens) and the model is randomly initialised, then both are saved
as an ordinary Hugging Face directory that every other part of rlsys loads by path.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from rlsys.config.schema import ModelConfig
from rlsys.models.saving import save_pretrained
from rlsys.run.cache import atomic_dir, cache_dir, fingerprint

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
BUILTIN_PREFIX = "builtin:"
VL_NAMES = ("tiny-vl",)  # built-in names that are vision-language models (builtin_vl.py)
_ALPHABET = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"] + ["\n"]
# The char tokenizer's chat template: ChatML's shape in characters the alphabet covers,
# ``<role>content</>\n`` per message and ``<assistant>`` to open the reply. With it the built-in
# models take ``task.chat_template=true`` and serve the agent endpoint (``task.env.name=
# openai_agent``). It does not render ``tools``: the hermes / smollm2 formats declare them.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _char_vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate([PAD, EOS, UNK, *_ALPHABET])}


def build_char_tokenizer():
    """A character-level fast tokenizer covering printable ASCII (vocab ~100), with
    ``CHAT_TEMPLATE``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = _char_vocab()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _saved_tokenizer_json(path: str) -> dict:
    try:
        with open(Path(path) / "tokenizer.json", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def saved_char_tokenizer(path: str) -> bool:
    """Whether the model directory ``path`` holds the built-in char tokenizer (its
    ``tokenizer.json`` read as data; False when there is none or it does not parse)."""
    model = _saved_tokenizer_json(path).get("model") or {}
    return (
        isinstance(model, dict)
        and model.get("type") == "WordLevel"
        and model.get("vocab") == _char_vocab()
    )


def saved_extra_tokens(path: str) -> list[str]:
    """Special tokens the char tokenizer at ``path`` has beyond its own (the VL model's
    vision tokens), in id order."""
    added = _saved_tokenizer_json(path).get("added_tokens") or []
    own = set(_char_vocab())
    rows = sorted(
        (t["id"], t["content"])
        for t in added
        if isinstance(t, dict) and t.get("content") not in own
    )
    return [content for _, content in rows]


def build_tiny_model(cfg: ModelConfig, vocab_size: int, pad_id: int, eos_id: int, seed: int):
    """A randomly initialised Qwen2 decoder with the architecture in ``cfg``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def builtin_dir(cfg: ModelConfig, seed: int = 0) -> Path:
    """Cache directory of the built-in model described by ``cfg`` (built on first use)."""
    spec = {
        "name": cfg.path,
        "arch": [
            cfg.hidden_size,
            cfg.num_layers,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.intermediate_size,
            cfg.max_position_embeddings,
            cfg.tie_word_embeddings,
        ],
        "alphabet": _ALPHABET,
        "chat_template": CHAT_TEMPLATE,
        "seed": seed,
    }
    name = cfg.path[len(BUILTIN_PREFIX) :] or "tiny"
    vision = name in VL_NAMES
    if vision:
        from rlsys.models.builtin_vl import vision_spec

        spec["vision"] = vision_spec()
    target = cache_dir() / "models" / f"{name}-{fingerprint(spec)}"
    if not (target / "config.json").exists():
        with atomic_dir(target) as tmp:
            if vision:
                from rlsys.models.builtin_vl import save_tiny_vl

                save_tiny_vl(cfg, tmp, seed)
                return target
            tokenizer = build_char_tokenizer()
            model = build_tiny_model(
                cfg, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, seed
            )
            save_pretrained(model, tmp)
            tokenizer.save_pretrained(tmp)
    return target


def build_tiny_reward_model(
    out_dir: str | Path, hidden_size: int = 64, num_layers: int = 1, seed: int = 0
) -> Path:
    """Save a randomly initialised Qwen2 reward model (one score per sequence) with the char
    tokenizer as a Hugging Face directory at ``out_dir``; returns the directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tokenizer = build_char_tokenizer()
    # right padding: the scoring head reads the last token that is not the pad token
    tokenizer.padding_side = "right"
    num_heads = max(1, hidden_size // 32)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=1024,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(config)
    target = Path(out_dir)
    save_pretrained(model, target)
    tokenizer.save_pretrained(target)
    return target
