"""Every tokenizer rlsys saves reads back as the same tokenizer, through rlsys's loader and
through transformers' AutoTokenizer (issue 49: a transformers upgrade once re-saved the
built-in char tokenizer as byte-level BPE, and every space of a prompt changed id). Kinds
saved: the built-in char tokenizer, the VL model's (vision tokens added), and a hub-style
byte-level BPE with a chat template (SmolLM2's kind, built here offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from rlsys.models.loading import load_tokenizer, save_tokenizer, saved_tokenizer

TEXTS = [
    "12+34=46",
    "  two  spaces, a\ttab and a\nnew line ",
    "What is 7 * 8? Answer: \\boxed{56}",
    "ünïcödé — ok",
    "",
]


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> str:
    """A byte-level BPE tokenizer with special tokens and a chat template, saved the way hub
    models ship theirs (tokenizer.json + tokenizer_config.json)."""
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps"] * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>")
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    out = tmp_path_factory.mktemp("bpe")
    tok.save_pretrained(out)
    return str(out)


def _same(before, after) -> None:
    assert len(after) == len(before)
    assert after.eos_token_id == before.eos_token_id
    assert after.all_special_tokens == before.all_special_tokens
    for text in TEXTS:
        ids = before.encode(text, add_special_tokens=False)
        assert after.encode(text, add_special_tokens=False) == ids, text
        assert after.decode(ids) == before.decode(ids), text


@pytest.mark.parametrize("kind", ["char", "vl", "bpe"])
def test_a_saved_tokenizer_reads_back_the_same(
    kind, tiny_model_dir, tiny_vl_dir, bpe_dir, tmp_path
):
    source = {"char": tiny_model_dir, "vl": tiny_vl_dir, "bpe": bpe_dir}[kind]
    before = saved_tokenizer(source)
    save_tokenizer(source, str(tmp_path / "saved"))
    _same(before, saved_tokenizer(str(tmp_path / "saved")))
    loaded = load_tokenizer(str(tmp_path / "saved"))
    assert loaded.padding_side == "left" and loaded.pad_token_id is not None
    if kind == "bpe":  # a hub tokenizer also reads back through transformers itself
        _same(before, AutoTokenizer.from_pretrained(tmp_path / "saved"))
        chat = [{"role": "user", "content": "2+2?"}]
        assert loaded.apply_chat_template(chat, tokenize=False) == before.apply_chat_template(
            chat, tokenize=False
        )
    if kind == "vl":
        assert Path(tmp_path / "saved" / "preprocessor_config.json").is_file()
