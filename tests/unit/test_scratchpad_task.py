"""The arithmetic_scratchpad task (chain sums answered with worked steps) and its
``scratchpad`` reward, which scores only the final marked answer."""

from __future__ import annotations

import dataclasses

import pytest

from rlsys.config import ConfigError
from rlsys.config.schema import TaskConfig
from rlsys.data.tasks import chain_level, load_task, scratchpad_problem
from rlsys.resolve import load_config
from rlsys.rewards import REWARDS
from rlsys.rewards.math import marked_answer


def test_scratchpad_problem_restates_each_step_and_marks_the_final_answer():
    assert scratchpad_problem([23, 45, 17]) == ("23+45+17=", "23+45=68;68+17=85;#85")
    assert scratchpad_problem([99, 99, 99, 99]) == (
        "99+99+99+99=",
        "99+99=198;198+99=297;297+99=396;#396",
    )
    assert scratchpad_problem([0, 5]) == ("0+5=", "0+5=5;#5")


def test_chain_level_counts_operands_and_carries_of_every_step():
    assert chain_level([23, 45, 17]) == "3:1"  # 23+45: none; 68+17: the units carry
    assert chain_level([99, 99, 99, 99]) == "4:6"
    assert chain_level([10, 20, 30]) == "3:0"


def test_task_is_deterministic_unique_with_disjoint_splits_and_fitting_bound():
    preset = load_config(["task=arithmetic_scratchpad"]).task
    cfg = dataclasses.replace(preset, train_size=300, eval_size=50)
    splits = load_task(cfg, seed=3)
    again = load_task(cfg, seed=3)
    assert [p.text for p in splits.train] == [p.text for p in again.train]
    texts = [p.text for p in splits.train + splits.eval]
    assert len(texts) == len(set(texts)) == 350
    assert {p.text.count("+") + 1 for p in splits.train} == {3, 4}
    for p in splits.train + splits.eval:
        assert scratchpad_problem([int(x) for x in p.text[:-1].split("+")]) == (p.text, p.answer)
        assert p.meta["level"] == chain_level([int(x) for x in p.text[:-1].split("+")])
    # the longest reply (four 99s, 36 characters) and EOS fit
    assert splits.max_new_tokens == 37
    assert max(len(p.answer) for p in splits.train) < splits.max_new_tokens


def test_task_refuses_other_operators_and_bad_counts_naming_the_key():
    with pytest.raises(ConfigError, match=r"task.operators"):
        load_task(TaskConfig(name="arithmetic_scratchpad", operators=["+", "*"]), seed=0)
    with pytest.raises(ConfigError, match=r"task.operand_counts"):
        TaskConfig(name="arithmetic_scratchpad", operand_counts=[1, 3])
    with pytest.raises(ValueError, match=r"task.train_size \+ task.eval_size"):
        load_task(TaskConfig(name="arithmetic_scratchpad", digits=1, operand_counts=[2]), seed=0)


def test_marked_answer_takes_a_bare_number_after_the_last_marker():
    assert marked_answer("23+45=68;68+17=85;#85") == "85"
    assert marked_answer("#1;#-7 ") == "-7"
    assert marked_answer("23+45=68;68+17=85") is None  # no marker
    assert marked_answer("68+17=85;#85;") is None  # something after the number
    assert marked_answer("#") is None


def test_scratchpad_reward_scores_only_the_final_answer():
    reward = REWARDS.get("scratchpad")
    meta = {"answer": "23+45=68;68+17=85;#85"}
    assert reward("23+45+17=", "23+45=68;68+17=85;#85", meta) == 1.0
    assert reward("23+45+17=", "23+45=69;69+17=85;#85", meta) == 1.0  # steps not checked
    assert reward("23+45+17=", "23+45=68;68+17=86;#86", meta) == 0.0
    assert reward("23+45+17=", "23+45=68;68+17=85;85", meta) == 0.0  # no marker: wrong format
    assert reward("23+45+17=", "85", meta) == 0.0
    assert reward("23+45+17=", "#85", {"answer": "85"}) == 1.0  # a bare reference number
