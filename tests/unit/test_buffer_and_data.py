"""The arithmetic task, file datasets, collation and sampling."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlsys.backends.data_parallel import forward_plan, train_plan
from rlsys.config.errors import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.data.collate import pack, position_ids
from rlsys.data.sampler import PromptSampler
from rlsys.data.tasks import arithmetic_problem, load_task
from rlsys.types import Prompt


def test_arithmetic_answers_are_padded_and_reversed():
    assert arithmetic_problem(46, "+", 78, 2, reverse=True) == ("46+78=", "421")
    assert arithmetic_problem(3, "+", 4, 2, reverse=False) == ("3+4=", "007")
    assert arithmetic_problem(3, "-", 40, 2, reverse=False) == ("40-3=", "37")
    assert arithmetic_problem(12, "*", 12, 2, reverse=True) == ("12*12=", "4410")
    assert arithmetic_problem(5, "+", 29, 2, reverse=True, pad_operands=True) == ("05+29=", "430")


def test_arithmetic_task_is_deterministic_with_disjoint_splits():
    cfg = TaskConfig(train_size=2000, eval_size=300)
    a, b = load_task(cfg, seed=7), load_task(cfg, seed=7)
    assert [p.text for p in a.train] == [p.text for p in b.train]
    assert len(a.train) == 2000 and len(a.eval) == 300
    assert not {p.text for p in a.train} & {p.text for p in a.eval}
    assert a.max_new_tokens == 4  # 3 answer digits + EOS
    with pytest.raises(ValueError, match="task.train_size"):
        load_task(TaskConfig(digits=1, train_size=1000, eval_size=10), seed=0)


def test_split_seed_holds_one_split_across_run_seeds():
    """``task.split_seed`` fixes the problems and the held-out set whatever the run's seed;
    left null, each run seed draws its own."""
    cfg = TaskConfig(train_size=2000, eval_size=300)
    own = [[p.text for p in load_task(cfg, seed=s).eval] for s in (1, 2)]
    assert own[0] != own[1]
    fixed = TaskConfig(train_size=2000, eval_size=300, split_seed=7)
    shared = [load_task(fixed, seed=s) for s in (1, 2)]
    assert [p.text for p in shared[0].eval] == [p.text for p in shared[1].eval]
    assert [p.text for p in shared[0].train] == [p.text for p in load_task(cfg, seed=7).train]
    with pytest.raises(ConfigError, match="task.split_seed"):
        TaskConfig(split_seed=-1)


def test_file_task_reads_jsonl_and_parquet_and_skips_bad_rows(tmp_path):
    rows = [{"q": f"{i}+1=", "a": str(i + 1), "level": i % 3} for i in range(50)]
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"q": 5}\nnot json\n')
    cfg = TaskConfig(
        name="file", train_path=str(jsonl), prompt_key="q", answer_key="a", eval_size=10
    )
    task = load_task(cfg, seed=0)
    assert task.skipped_rows == 2
    assert len(task.train) + len(task.eval) == 50
    assert task.train[0].meta["level"] in (0, 1, 2)
    parquet = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows[:7]), parquet)
    cfg2 = TaskConfig(
        name="file", train_path=str(jsonl), eval_path=str(parquet), prompt_key="q", answer_key="a"
    )
    assert [p.answer for p in load_task(cfg2, seed=0).eval] == [r["a"] for r in rows[:7]]


def test_pack_aligns_loss_mask_and_logprobs_with_targets():
    batch = pack(
        [[5, 6, 7], [8]],
        [[1, 2], [3, 4, 9]],
        pad_id=0,
        response_logprobs=[[-0.1, -0.2], [-0.3, -0.4, -0.5]],
    )
    # width = 3 + 3; row 1 prompt left-padded by 2
    assert batch.input_ids.tolist() == [[5, 6, 7, 1, 2, 0], [0, 0, 8, 3, 4, 9]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    targets = batch.input_ids[:, 1:]
    assert targets[batch.loss_mask > 0].tolist() == [1, 2, 3, 4, 9]
    assert batch.behaviour_logprobs[batch.loss_mask > 0].tolist() == pytest.approx(
        [-0.1, -0.2, -0.3, -0.4, -0.5]
    )
    assert position_ids(batch.attention_mask).tolist()[1] == [0, 0, 0, 1, 2, 3]


def test_sampler_covers_every_prompt_each_epoch_and_restores_state():
    prompts = [Prompt(i, str(i), str(i)) for i in range(10)]
    sampler = PromptSampler(prompts, batch_size=4, shuffle=True, seed=1)
    seen = [p.uid for _ in range(5) for p in sampler.next_batch()]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    state = sampler.state_dict()
    nxt = [p.uid for p in sampler.next_batch()]
    other = PromptSampler(prompts, batch_size=4, shuffle=True, seed=1)
    other.load_state_dict(state)
    assert [p.uid for p in other.next_batch()] == nxt


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_data_parallel_plans_cover_rows_once_with_aligned_micro_batch_counts(world_size):
    mask = np.ones((13, 4), dtype=np.float32)
    mask[:, 2:] = 0
    plans = [
        train_plan(mask, world_size, r, num_mini_batches=2, micro=3, seed=0)
        for r in range(world_size)
    ]
    rows = np.concatenate([mb for p in plans for plan in p for mb in plan.micro_batches])
    assert sorted(rows.tolist()) == list(range(13))
    for m in range(2):
        counts = {len(p[m].micro_batches) for p in plans}
        assert len(counts) == 1  # same number of micro-batches on every rank
        assert {p[m].global_tokens for p in plans} == {
            float(mask[np.concatenate([mb for pr in plans for mb in pr[m].micro_batches])].sum())
        }
    fwd = [forward_plan(5, world_size, r, micro=2) for r in range(world_size)]
    assert sorted(np.concatenate([m for f in fwd for m in f]).tolist()) == list(range(5))
    assert len({len(f) for f in fwd}) == 1


def test_train_plan_never_makes_more_mini_batches_than_rows():
    mask = np.ones((3, 2), dtype=np.float32)
    plans = train_plan(mask, world_size=2, rank=0, num_mini_batches=8, micro=4, seed=0)
    assert len(plans) == 3 and all(p.global_tokens > 0 for p in plans)


def test_bad_rows_and_long_prompts_are_skipped_and_counted_at_start(tmp_path, tiny_model_dir):
    from rlsys.models.loading import load_tokenizer
    from rlsys.trainers.collector import RolloutCollector

    good = [{"q": f"{i}+1=", "a": i + 1} for i in range(30)]  # a number answer is fine
    bad = [
        {"a": "1"},  # no prompt
        {"q": 12, "a": "1"},  # prompt of the wrong type
        {"q": "1+1=", "a": ["2"]},  # answer of the wrong type
        {"q": "1+1=", "a": None},  # no answer
        {"q": "9" * 200 + "+1=", "a": "1"},  # longer than max_prompt_tokens
        {"q": "8" * 200 + "+1=", "a": "1"},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in good + bad) + "\n{truncated")
    cfg = TaskConfig(
        name="file",
        train_path=str(path),
        prompt_key="q",
        answer_key="a",
        eval_size=5,
        max_prompt_tokens=16,
    )
    collector = RolloutCollector.for_task(None, load_tokenizer(tiny_model_dir), cfg)
    task = load_task(cfg, seed=0).screen_prompts(collector.prompt_length, 16)
    assert task.summary() == {
        "train_prompts": len(task.train),
        "eval_prompts": len(task.eval),
        "skipped_malformed_rows": 5,
        "skipped_too_long": 2,
    }
    assert len(task.train) + len(task.eval) == 30
    assert all(len(p.text) < 10 for p in task.train + task.eval)
