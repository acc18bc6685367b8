"""Load a policy and its tokenizer from a built-in name, a GGUF model, a local directory or a
hub id."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.config.schema import ModelConfig
from rlsys.models.builtin import (
    BUILTIN_PREFIX,
    build_char_tokenizer,
    builtin_dir,
    saved_char_tokenizer,
    saved_extra_tokens,
)
from rlsys.models.gguf import GGUF_PREFIX, gguf_dir
from rlsys.models.hub import check_hub_model

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def _looks_local(path: str) -> bool:
    """Whether ``path`` means a directory here rather than a hub id ("org/name"): it exists,
    or starts like a path (/, ., ~), or has more than one "/"."""
    return os.path.exists(path) or path.startswith(("/", ".", "~")) or path.count("/") > 1


def check_model_path(path: str, key: str = "model.path") -> None:
    """Raise ConfigError unless ``path`` (built-in, gguf: or hub ids aside) is a directory
    with a readable config.json; hub ids are left to ``from_pretrained``."""
    if path.startswith((BUILTIN_PREFIX, GGUF_PREFIX)) or not _looks_local(path):
        return
    local = os.path.expanduser(path)
    fix = (
        "pass a Hugging Face model directory (with config.json), a hub id such as "
        "HuggingFaceTB/SmolLM2-135M-Instruct, builtin:tiny or gguf:smollm2-135m-instruct"
    )
    if not os.path.isdir(local):
        what = "is not a directory" if os.path.exists(local) else "does not exist"
        raise ConfigError(f"{key}={path!r} {what}; {fix}")
    config = os.path.join(local, "config.json")
    if not os.path.isfile(config):
        raise ConfigError(f"{key}={path!r} has no config.json (not a model directory); {fix}")
    try:
        with open(config, encoding="utf-8") as fh:
            parsed = json.load(fh)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{key}={path!r}: config.json is unreadable ({exc}); {fix}") from exc
    if not isinstance(parsed, dict) or "model_type" not in parsed:
        raise ConfigError(f"{key}={path!r}: config.json has no model_type; {fix}")
    check_weights(local, parsed, f"{key}={path!r}")


# Embedding elements no real model comes near (the largest vocabularies, ~262k, times the widest
# hidden sizes, ~16k, are ~4e9): an absurd vocab_size or hidden_size would otherwise be found
# by an allocation failure in every actor half a minute after Ray started
MAX_EMBEDDING_ELEMENTS = 2 * 10**10
MAX_HEADER_BYTES = 100 << 20  # safetensors' own bound on a header


def check_weights(local: str, config: dict, where: str) -> None:
    """A model directory's shape and weights checked before any actor loads them: the
    config's vocabulary and width are sane, each ``.safetensors`` file's header parses and
    every tensor lies within the file (a truncated download), and the embedding's rows match
    ``vocab_size``. Reads headers only (a few KB), never tensor data."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab, hidden = text.get("vocab_size"), text.get("hidden_size")
    for name, value in (("vocab_size", vocab), ("hidden_size", hidden)):
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{where}: config.json's {name}={value!r} is not a positive integer")
    if (
        isinstance(vocab, int)
        and isinstance(hidden, int)
        and vocab * hidden > MAX_EMBEDDING_ELEMENTS
    ):
        raise ConfigError(
            f"{where}: config.json's vocab_size={vocab} x hidden_size={hidden} is an embedding "
            f"of {vocab * hidden:.3g} elements, beyond any real model; fix config.json"
        )
    for file in sorted(Path(local).glob("*.safetensors")):
        header = _safetensors_header(file, where)
        data_bytes = file.stat().st_size - 8 - header["__header_bytes__"]
        for name, info in header.items():
            if name.startswith("__"):
                continue
            try:
                start, end = info["data_offsets"]
                shape = list(info["shape"])
            except (TypeError, KeyError, ValueError) as exc:
                raise ConfigError(
                    f"{where}: {file.name} has a malformed entry for {name!r} ({exc}); "
                    "re-save or re-download the model"
                ) from exc
            if not 0 <= start <= end <= data_bytes:
                raise ConfigError(
                    f"{where}: {file.name} is truncated or damaged: {name!r} lies at bytes "
                    f"{start}-{end} of {data_bytes}; re-download or re-save the model"
                )
            embedding = name.endswith(("embed_tokens.weight", "wte.weight"))
            if embedding and isinstance(vocab, int) and shape and shape[0] != vocab:
                raise ConfigError(
                    f"{where}: {file.name}'s {name} has {shape[0]} rows but config.json's "
                    f"vocab_size={vocab}; the weights and config.json are of different models"
                )


def _safetensors_header(file: Path, where: str) -> dict:
    """The JSON header of a safetensors file (with its size under ``__header_bytes__``)."""
    import struct

    bad = f"{where}: {file.name} is not a readable safetensors file"
    try:
        with file.open("rb") as fh:
            raw = fh.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
            fits = 0 < length <= min(MAX_HEADER_BYTES, file.stat().st_size - 8)
            header = json.loads(fh.read(length)) if fits else None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{bad} ({exc}); re-download or re-save the model") from exc
    if not fits:
        raise ConfigError(f"{bad} (its header length {length} does not fit the file)")
    if not isinstance(header, dict):
        raise ConfigError(f"{bad} (its header is not a JSON object)")
    header["__header_bytes__"] = length
    return header


def resolve_model_path(cfg: ModelConfig) -> str:
    """A path or hub id that ``from_pretrained`` accepts (builds built-in models and converts
    GGUF models once, into the cache; a hub id must be cached or answer on the hub)."""
    check_model_path(cfg.path)
    if cfg.path.startswith(BUILTIN_PREFIX):
        return str(builtin_dir(cfg))
    if cfg.path.startswith(GGUF_PREFIX):
        return str(gguf_dir(cfg.path))
    if not _looks_local(cfg.path):
        check_hub_model(cfg.path)
    return os.path.expanduser(cfg.path)


def saved_tokenizer(path: str):
    """The tokenizer saved at ``path``, as saved. The built-in char tokenizer is built
    directly: AutoTokenizer would load it as the model type's tokenizer class (Qwen2's), whose
    byte-level pre-tokenizer drops spaces, and importing AutoTokenizer costs seconds of every
    run's start."""
    if saved_char_tokenizer(path):
        tokenizer = build_char_tokenizer()
        extra = saved_extra_tokens(path)
        if extra:  # the VL model's vision tokens, with the ids they were saved with
            tokenizer.add_special_tokens({"additional_special_tokens": extra})
        return tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def save_tokenizer(model_path: str, out_dir: str, padding_side: str | None = None) -> None:
    """Write the tokenizer of ``model_path`` into ``out_dir`` as ``saved_tokenizer`` reads it,
    so the saved directory tokenizes exactly as the source does. (AutoTokenizer would re-save
    the built-in char tokenizer as Qwen2's byte-level BPE, and a model trained on its ids would
    then read different ones: with transformers 5.19 every space of a prompt changed id.)"""
    tokenizer = saved_tokenizer(model_path)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    tokenizer.save_pretrained(out_dir)
    processor = os.path.join(model_path, "preprocessor_config.json")
    if os.path.isfile(processor):  # a VL model's image processor goes with its tokenizer
        shutil.copyfile(processor, os.path.join(out_dir, "preprocessor_config.json"))


def load_tokenizer(path: str):
    """The tokenizer at ``path``, left-padding, with a pad token; a vision-language model's
    carries its image processor as ``image_encoder`` (``rlsys.models.vision.ImageEncoder``;
    None for text-only models), as a Hugging Face processor bundles the two."""
    from rlsys.models.vision import ImageEncoder, is_vision_model

    tokenizer = saved_tokenizer(path)
    tokenizer.image_encoder = ImageEncoder(path) if is_vision_model(path) else None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def end_token_ids(path: str, tokenizer) -> set[int]:
    """Token ids that end a generated reply, as the engines stop on them: the tokenizer's EOS
    and the model's (``eos_token_id`` of ``config.json`` and ``generation_config.json`` in
    the model directory ``path``: an id or a list; absent files are skipped)."""
    ids = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    for name in ("config.json", "generation_config.json"):
        file = os.path.join(path, name)
        if os.path.isfile(file):
            with open(file) as f:
                eos = json.load(f).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return ids


# where a config.json states the longest sequence the model was built for
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def context_length(path: str) -> int | None:
    """The longest sequence (prompt + response) the model at ``path`` (a directory, or a hub
    id) was built for: its text config's ``max_position_embeddings`` (a VL model's is under
    ``text_config``) or an equivalent key; None when its config states none."""
    local = os.path.expanduser(path)
    if os.path.isdir(local):
        with open(os.path.join(local, "config.json"), encoding="utf-8") as fh:
            config = json.load(fh)
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path).to_dict()
    for part in (config.get("text_config") or {}, config):
        for key in _CONTEXT_KEYS:
            if isinstance(part.get(key), int) and part[key] > 0:
                return part[key]
    return None


def load_model(path: str, dtype: str = "float32"):
    """The causal LM at ``path`` in ``dtype``, in eval mode (a vision-language model, e.g.
    Qwen2-VL, as its image-text-to-text class)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from rlsys.models.vision import is_vision_model

    auto = AutoModelForImageTextToText if is_vision_model(path) else AutoModelForCausalLM
    try:
        model = auto.from_pretrained(path, dtype=getattr(torch, _DTYPES[dtype]))
    except OSError as exc:
        raise FileNotFoundError(
            f"model.path={path!r} is neither a local Hugging Face directory nor a reachable "
            "hub id; pass a directory containing config.json, builtin:tiny or "
            "gguf:smollm2-135m-instruct"
        ) from exc
    return model.eval()
