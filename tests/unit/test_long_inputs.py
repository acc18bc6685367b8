"""Inputs too long to use are dropped cheaply: a jsonl line over the line bound is read past
as it streams, and a prompt that cannot fit task.max_prompt_tokens whatever it tokenizes to
is left out without tokenizing it (issue 47: one 10 MB line cost 25 s and 3.8 GiB before it
was skipped)."""

from __future__ import annotations

import json
import time

from rlsys.data.rows import MAX_LINE_BYTES, read_rows
from rlsys.models.loading import load_tokenizer
from rlsys.trainers.collector import RolloutCollector
from rlsys.types import Prompt


class CountingTokenizer:
    """The real tokenizer, counting the characters it was asked to encode."""

    def __init__(self, tokenizer) -> None:
        self.inner, self.encoded_chars = tokenizer, 0

    def encode(self, text: str, **kwargs):
        self.encoded_chars += len(text)
        return self.inner.encode(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_line_over_the_bound_is_skipped_as_it_streams(tmp_path, caplog):
    path = tmp_path / "rows.jsonl"
    long = json.dumps({"prompt": "1+" * (MAX_LINE_BYTES // 2 + 10), "answer": "2"})
    path.write_text("\n".join([json.dumps({"prompt": "1+1=", "answer": "2"}), long, "{}"]))
    start = time.perf_counter()
    rows = read_rows(str(path))
    assert time.perf_counter() - start < 2
    assert rows[0] == {"prompt": "1+1=", "answer": "2"} and rows[1] == {} and len(rows) == 3
    assert "1 lines over 8 MiB (lines 2)" in caplog.text


def test_a_prompt_that_cannot_fit_is_left_out_without_tokenizing_it(tiny_model_dir):
    tokenizer = CountingTokenizer(load_tokenizer(tiny_model_dir))
    collector = RolloutCollector(None, tokenizer, None, 50)
    huge = Prompt(uid=0, text="12+34=" * 2_000_000, answer="46")  # 12 MB of text
    short = Prompt(uid=1, text="12+34=", answer="46")
    start = time.perf_counter()
    assert collector.prompt_length(huge) > 50
    kept, ids = collector.encode([huge, short])
    assert time.perf_counter() - start < 1
    assert kept == [short] and len(ids) == 1 and collector.skipped_prompts == 1
    assert tokenizer.encoded_chars < 100  # only the short prompt was tokenized
    # a prompt near the limit is still tokenized and judged by its real length
    near = Prompt(uid=2, text="1" * 49, answer="1")
    assert collector.prompt_length(near) == len(tokenizer.inner.encode("1" * 49))
