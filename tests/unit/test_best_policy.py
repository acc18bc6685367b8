"""``eval.validation_prompts``: the best policy by validation accuracy, exported and kept."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlsys.checkpoint.store import CheckpointError
from rlsys.config.errors import ConfigError
from rlsys.resolve.inputs import validation_split
from rlsys.trainers.rl.selection import BestPolicy, Selection, validation_key
from rlsys.types import Prompt

KEY = validation_key([Prompt(0, "3 + 4", "7"), Prompt(1, "5 + 6", "11")])


class _Policy:
    """Stands in for the learner's export: writes the step it was trained to."""

    def __init__(self) -> None:
        self.step, self.saves = 0, 0

    def save(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "weights.txt").write_text(str(self.step))
        self.saves += 1


def _eval(validation: float, accuracy: float) -> dict[str, float]:
    return {"eval/validation_accuracy": validation, "eval/accuracy": accuracy}


def _held(best: Path) -> tuple[int, dict]:
    return int((best / "weights.txt").read_text()), json.loads(
        (best / "selection.json").read_text()
    )


def test_exports_only_a_policy_that_beats_every_earlier_validation(tmp_path):
    policy, best = _Policy(), tmp_path / "checkpoints" / "best"
    keeper = BestPolicy(best, policy.save, KEY)
    assert keeper.chosen is None
    history = [
        (0, 0.25, 0.30),
        (20, 0.70, 0.65),
        (40, 0.70, 0.90),
        (60, 0.60, 0.95),
        (80, 0.75, 0.8),
    ]
    exported = []
    for step, validation, accuracy in history:
        policy.step = step
        exported.append(keeper.consider(step, _eval(validation, accuracy)))
    # a tie (step 40) keeps the earlier policy; the held-out figure never enters the choice
    assert exported == [True, True, False, False, True]
    assert keeper.chosen == Selection(80, 0.75, 0.8)
    record = {"step": 80, "validation_accuracy": 0.75, "accuracy": 0.8, "validation_set": KEY}
    assert _held(best) == (80, record)
    assert sorted(p.name for p in best.parent.iterdir()) == ["best"]  # nothing staged left


def test_a_resumed_run_keeps_the_best_written_before_it(tmp_path):
    policy, best = _Policy(), tmp_path / "best"
    policy.step = 20
    BestPolicy(best, policy.save, KEY).consider(20, _eval(0.8, 0.7))
    # a new process of the run (a resume), or a rewind to step 10: the record on disk holds
    resumed = BestPolicy(best, policy.save, KEY)
    assert resumed.chosen == Selection(20, 0.8, 0.7)
    policy.step = 30
    assert not resumed.consider(30, _eval(0.79, 0.9))
    assert _held(best)[0] == 20 and policy.saves == 1
    assert resumed.consider(40, _eval(0.81, 0.6))


def test_every_state_a_crash_can_leave_gives_one_complete_best(tmp_path):
    policy, best = _Policy(), tmp_path / "best"
    policy.step = 20
    BestPolicy(best, policy.save, KEY).consider(20, _eval(0.8, 0.7))
    staged, retired = tmp_path / ".tmp-best", tmp_path / ".old-best"
    # killed mid-export: a partial staged copy beside the old best
    staged.mkdir()
    (staged / "weights.txt").write_text("partial")
    assert BestPolicy(best, policy.save, KEY).chosen == Selection(20, 0.8, 0.7)
    # killed between the two renames: the old one retired, the new one not yet in place
    best.rename(retired)
    assert BestPolicy(best, policy.save, KEY).chosen == Selection(20, 0.8, 0.7)
    assert _held(best)[0] == 20 and not retired.exists()
    # killed after the swap, before the retired copy was deleted: a later export still swaps
    shutil.copytree(best, retired)
    keeper = BestPolicy(best, policy.save, KEY)
    assert not retired.exists()
    policy.step = 30
    assert keeper.consider(30, _eval(0.9, 0.8)) and _held(best)[0] == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]


def test_a_record_of_other_prompts_or_an_earlier_run_is_replaced(tmp_path):
    policy, best = _Policy(), tmp_path / "best"
    policy.step = 40
    BestPolicy(best, policy.save, KEY).consider(40, _eval(0.9, 0.9))
    other = BestPolicy(best, policy.save, validation_key([Prompt(0, "1 + 1", "2")]))
    assert other.chosen is None  # eval.* or task.* changed: the choice starts over
    restarted = BestPolicy(best, policy.save, KEY)
    restarted.start_over()  # a run from step 0 in the directory: its own step 0 replaces it
    policy.step = 0
    assert restarted.consider(0, _eval(0.2, 0.25)) and _held(best)[0] == 0


@pytest.mark.parametrize(
    "record",
    [
        "{not json",
        '{"step": 3}',
        '{"step": -1, "validation_accuracy": 1, "accuracy": 1, "validation_set": "x"}',
        '{"step": 2.5, "validation_accuracy": 1, "accuracy": 1, "validation_set": "x"}',
    ],
)
def test_a_bad_record_is_refused_naming_the_file_and_the_fix(tmp_path, record):
    best = tmp_path / "best"
    best.mkdir()
    (best / "selection.json").write_text(record)
    with pytest.raises(CheckpointError, match=r"selection\.json.*delete .*best"):
        BestPolicy(best, _Policy().save, KEY)


def test_the_validation_prompts_follow_the_reported_ones_and_need_room():
    held_out = list(range(500))
    assert validation_split(held_out, 200, 200) == list(range(200, 400))
    with pytest.raises(ConfigError, match=r"eval.validation_prompts=400 needs 600 .*holds out 500"):
        validation_split(held_out, 200, 400)
