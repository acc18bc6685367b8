"""Datasets as users have them (issue 49): verl's parquet layout unchanged (chat-message
prompts, ``reward_model.ground_truth``, ``data_source``, ``extra_info``; written by pandas the
way verl's preprocessing scripts write it), dotted column keys, a JSON array file, and CSV."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from rlsys.config import ConfigError
from rlsys.config.task import TaskConfig
from rlsys.data.tasks import file_task
from rlsys.models.loading import load_tokenizer
from rlsys.trainers.collector import PromptFormat


def verl_rows(count: int) -> list[dict]:
    """Rows as verl's examples/data_preprocess/gsm8k.py writes them."""
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "system", "content": "Answer with a number."},
                {"role": "user", "content": f"{i}+{i}="},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i, "question": f"What is {i}+{i}?"},
        }
        for i in range(count)
    ]


def test_a_verl_parquet_file_reads_as_it_is(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame(verl_rows(40)).to_parquet(path)
    splits = file_task(TaskConfig(name="file", train_path=str(path), eval_size=8), seed=0)
    prompt = splits.train[0]
    assert prompt.messages[0] == {"role": "system", "content": "Answer with a number."}
    n = int(prompt.messages[-1]["content"].split("+")[0])
    assert prompt.text == f"{n}+{n}=" and prompt.answer == str(2 * n)
    assert prompt.meta["data_source"] == "openai/gsm8k"
    assert prompt.meta["extra_info"]["index"] == n  # the reward's metadata
    assert len(splits.train) == 32 and len(splits.eval) == 8


def test_chat_message_prompts_render_with_the_models_template(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    messages = verl_rows(3)[2]["prompt"]
    rendered = PromptFormat(instruction="Be brief.").render("2+2=", tokenizer, messages)
    expected = tokenizer.apply_chat_template(
        [messages[0], {"role": "user", "content": "2+2=\n\nBe brief."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert rendered == expected


def test_dotted_keys_reach_nested_columns(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame(verl_rows(20)).to_parquet(path)
    cfg = TaskConfig(
        name="file",
        train_path=str(path),
        prompt_key="extra_info.question",
        answer_key="reward_model.ground_truth",
        eval_size=4,
    )
    prompt = file_task(cfg, seed=0).train[0]
    assert prompt.text.startswith("What is") and prompt.messages is None


def test_a_json_array_file_and_a_csv_file(tmp_path):
    rows = [{"prompt": f"{i}+1=", "answer": i + 1} for i in range(20)]
    array = tmp_path / "train.json"
    array.write_text(json.dumps(rows, indent=2))  # before: misread as JSON lines, all malformed
    splits = file_task(TaskConfig(name="file", train_path=str(array), eval_size=4), seed=0)
    assert len(splits.train) + len(splits.eval) == 20 and splits.skipped_rows == 0
    csv = tmp_path / "train.csv"
    pd.DataFrame(rows).to_csv(csv, index=False)
    splits = file_task(TaskConfig(name="file", train_path=str(csv), eval_size=4), seed=0)
    assert sorted(p.answer for p in splits.train + splits.eval) == sorted(
        str(i + 1) for i in range(20)
    )


def test_a_file_without_the_named_columns_names_them(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame([{"question": "1+1=", "solution": "2"}] * 10).to_parquet(path)
    with pytest.raises(ConfigError, match=r"columns are \['question', 'solution'\]"):
        file_task(TaskConfig(name="file", train_path=str(path)), seed=0)


def test_datasets_directories_and_arrow_files(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(20)]
    data = datasets.Dataset.from_list(rows)
    data.save_to_disk(str(tmp_path / "ds"))
    splits = file_task(TaskConfig(name="file", train_path=str(tmp_path / "ds"), eval_size=4), 0)
    assert len(splits.train) + len(splits.eval) == 20
    both = datasets.DatasetDict({"train": data, "test": data.select(range(5))})
    both.save_to_disk(str(tmp_path / "dd"))
    cfg = TaskConfig(
        name="file", train_path=str(tmp_path / "dd"), eval_path=str(tmp_path / "dd" / "test")
    )
    splits = file_task(cfg, 0)
    assert (len(splits.train), len(splits.eval)) == (20, 5)
    (arrow,) = (tmp_path / "ds").glob("*.arrow")
    splits = file_task(TaskConfig(name="file", train_path=str(arrow), eval_size=4), 0)
    assert len(splits.train) == 16
    datasets.DatasetDict({"test": data}).save_to_disk(str(tmp_path / "only_test"))
    with pytest.raises(ConfigError, match=r"splits \['test'\] and no 'train'"):
        file_task(TaskConfig(name="file", train_path=str(tmp_path / "only_test")), 0)
