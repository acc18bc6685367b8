"""A checkpoint's controller state (trainer.json) is checked before any of it is used: a
wrong type, a non-finite number, a step out of range or nesting too deep makes the checkpoint
unusable like a damaged one, and resume falls back to the previous one with a warning naming
the file and what is wrong (issue 47 item 5).

The checkpoints are written by ``Recovery.save_checkpoint`` itself, with small fakes for the
learners, tracker and pipeline, so the state checked is the one a run saves."""

from __future__ import annotations

import functools
import json
import logging
import shutil
from pathlib import Path

import pytest

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.checkpoint.store import CheckpointError, CheckpointStore, step_of
from rlsys.config.schema import TrainConfig
from rlsys.data.sampler import PromptSampler
from rlsys.resolve import load_config
from rlsys.trainers.rl.recovery import Recovery
from rlsys.trainers.rl.state import RunState
from rlsys.types import Completion, Prompt, RolloutGroup, Sample

TOTAL_STEPS = 4


class _Learner:
    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir()
        (Path(path) / "shard.bin").write_text("weights")

    def load_checkpoint(self, path: str) -> None:
        self.loaded.append(path)


class _Pools:
    def __init__(self) -> None:
        self.learner, self.critic = _Learner(), None

    def sync_weights(self, version: int) -> None:
        pass


class _Tracker:
    def __init__(self) -> None:
        self.rewound: list[int] = []

    def rewind(self, step: int) -> None:
        self.rewound.append(step)


class _Pipeline:
    """The pipeline's checkpointed counters (its loops are not needed here)."""

    def __init__(self) -> None:
        self.drawn, self.calls, self.continued = 0, [0, 0], [0, 0]

    def state_dict(self) -> dict:
        return {"drawn": self.drawn, "calls": self.calls, "continued": self.continued}

    def load_state_dict(self, state: dict) -> None:
        self.drawn, self.calls, self.continued = state["drawn"], state["calls"], state["continued"]

    def raise_if_failed(self) -> None:
        pass


class _Recipe:
    kl_coef = 0.05


class _Collector:
    reward_errors = skipped_prompts = 0


def _parts() -> tuple[StreamingBuffer, PromptSampler, _Pipeline]:
    prompts = [Prompt(uid=i, text=f"{i}+1=", answer=str(i + 1)) for i in range(8)]
    buffer = StreamingBuffer(batch_size=2, group_size=1, max_staleness=1)
    return buffer, PromptSampler(prompts, 2, True, seed=0), _Pipeline()


@functools.cache
def _cfg() -> TrainConfig:
    return load_config([f"trainer.total_steps={TOTAL_STEPS}"])


def _recovery(tmp_path: Path) -> tuple[Recovery, _Tracker]:
    cfg = _cfg()
    state = RunState(*_parts())
    tracker = _Tracker()
    recovery = Recovery(
        cfg,
        _Pools(),
        state,
        checkpoints=CheckpointStore(tmp_path / "run" / "checkpoints", 3),
        tracker=tracker,
        recipe=_Recipe(),
        collector=_Collector(),
        scaler=None,
        run_info={"model_path": "builtin:tiny", "tracker_run_id": None},
        reset=lambda: state.reset(*_parts()),
        new_learners=lambda: None,
    )
    return recovery, tracker


def _run_with_checkpoints(tmp_path: Path) -> tuple[Recovery, _Tracker]:
    """A run with checkpoints after steps 1 and 2 (a queued group in each)."""
    recovery, tracker = _recovery(tmp_path)
    state = recovery.state
    for step in (1, 2):
        state.buffer.reserve(1)
        prompt = Prompt(uid=step, text="1+1=", answer="2")
        completion = Completion([1, 2], [-0.1, -0.2], "stop", step - 1)
        state.buffer.put(RolloutGroup(prompt, [Sample(prompt, [3], completion, "2", 1.0)]))
        state.totals.steps = state.version = step
        state.sampler.next_batch()
        state.buffer.pause()
        recovery.save_checkpoint()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    return recovery, tracker


def _edit_newest(tmp_path: Path, edit) -> Path:
    """Rewrite the newest checkpoint's trainer.json with ``edit(text) -> text`` and its
    manifest to match, as someone editing the file would: the size checks still pass."""
    newest = CheckpointStore(tmp_path / "run" / "checkpoints", 3).latest()
    file = newest / "trainer.json"
    file.write_text(edit(file.read_text()))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["files"]["trainer.json"] = file.stat().st_size
    (newest / "manifest.json").write_text(json.dumps(manifest))
    return newest


def _set(path: str, value: str):
    """An edit that puts the JSON text ``value`` at ``path`` (keys joined by dots) of the
    state."""

    def edit(text: str) -> str:
        document = json.loads(text)
        *parents, key = path.split(".")
        node = document["state"]
        for parent in parents:
            node = node[parent]
        node[key] = "@VALUE@"
        return json.dumps(document).replace('"@VALUE@"', value)

    return edit


DEEP = 100_000

INVALID = {
    "nan step": (_set("totals.steps", "NaN"), "totals.steps is nan"),
    "huge float step": (_set("totals.steps", "1e30"), "totals.steps is 1e+30"),
    "huge int step": (_set("totals.steps", str(10**30)), "beyond trainer.total_steps=4"),
    "step beyond total_steps": (_set("totals.steps", "9"), "beyond trainer.total_steps=4"),
    "another step": (_set("totals.steps", "1"), "but step_000002 is of step 2"),
    "version past step": (_set("version", "3"), "version is 3, beyond totals.steps=2"),
    "negative step": (_set("totals.steps", "-1"), "totals.steps is -1"),
    "bool step": (_set("totals.steps", "true"), "totals.steps is True"),
    "string version": (_set("version", '"2"'), "version is '2'"),
    "infinite kl_coef": (_set("kl_coef", "Infinity"), "kl_coef is inf"),
    "nan wall time": (_set("totals.train_wall_s", "NaN"), "totals.train_wall_s is nan"),
    "short marks": (_set("marks", "[1]"), "marks"),
    "sampler position": (_set("sampler.position", "-3"), "sampler.position is -3"),
    "buffer counter": (_set("buffer.stats.issued", "1.5"), "buffer.stats.issued is 1.5"),
    "python rng": (_set("rng.python", '"x"'), "rng.python"),
    "model path": (_set("run_info.model_path", "[1]"), "run_info.model_path"),
    "missing totals": (lambda t: t.replace('"totals"', '"tot"'), "totals is missing"),
    "deep nesting": (_set("run_info", "[" * DEEP + "]" * DEEP), "nested deeper than"),
}


@pytest.mark.parametrize("damage", INVALID, ids=list(INVALID))
def test_restore_falls_back_past_an_invalid_controller_state(tmp_path, caplog, damage):
    edit, reason = INVALID[damage]
    recovery, tracker = _run_with_checkpoints(tmp_path)
    newest = _edit_newest(tmp_path, edit)
    candidates = recovery.checkpoints.complete()
    assert [step_of(p) for p in candidates] == [2, 1]  # the edit keeps the manifest valid
    with caplog.at_level(logging.WARNING):
        restored = recovery.restore_newest(candidates)
    assert step_of(restored) == 1
    assert recovery.state.totals.steps == recovery.state.version == 1
    assert tracker.rewound == [1]
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"{newest / 'trainer.json'}" in warning and reason in warning, warning


@pytest.mark.parametrize("damage", ["nan step", "huge float step", "model path", "deep nesting"])
def test_resume_point_skips_an_invalid_controller_state(tmp_path, caplog, damage):
    """``rlsys train resume=auto`` picks its checkpoints (and the run_info it starts from)
    before Ray: an invalid newest one is skipped there, with the same warning (the same
    check: a few of the cases above)."""
    from rlsys.commands.train import _resume_point

    edit, reason = INVALID[damage]
    _run_with_checkpoints(tmp_path)
    newest = _edit_newest(tmp_path, edit)
    cfg = load_config(
        [f"run.output_dir={tmp_path}", "run.name=run", "resume=auto", "trainer.total_steps=4"]
    )
    with caplog.at_level(logging.WARNING):
        run_dir, candidates, run_info = _resume_point(cfg)
    assert run_dir == tmp_path / "run" and [step_of(p) for p in candidates] == [1]
    assert run_info["model_path"] == "builtin:tiny"
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert f"{newest / 'trainer.json'}" in warning and reason in warning, warning


def test_the_states_a_run_saves_are_valid(tmp_path):
    """Both checkpoints restore as saved (the check refuses nothing a run writes)."""
    recovery, tracker = _run_with_checkpoints(tmp_path)
    for path in recovery.checkpoints.complete():
        recovery.restore(path)
        assert recovery.state.totals.steps == recovery.state.version == step_of(path)
        assert len(recovery.state.buffer) == step_of(path)  # its queued groups
    assert tracker.rewound == [2, 1]


def test_resuming_past_total_steps_names_the_key_to_raise(tmp_path):
    """A checkpoint past the configured end is not damaged: when none is left to fall back
    to, the error says to raise trainer.total_steps."""
    from rlsys.commands.train import _resume_point

    _run_with_checkpoints(tmp_path)
    cfg = load_config(
        [f"run.output_dir={tmp_path}", "run.name=run", "resume=auto", "trainer.total_steps=1"]
    )
    run_dir, candidates, _ = _resume_point(cfg)  # step 1 still fits
    assert [step_of(p) for p in candidates] == [1]
    shutil.rmtree(candidates[0])
    with pytest.raises(CheckpointError, match=r"no checkpoint .*trainer.total_steps of at least 2"):
        _resume_point(cfg)


def test_nesting_is_bounded_when_written_and_when_read(tmp_path):
    """Deeper than MAX_DEPTH is refused when saving (so a run never writes a state it cannot
    resume) and when reading, below the parser's own recursion limit as well as above it."""
    from rlsys.checkpoint.state_file import MAX_DEPTH, StateFileError, read_state, write_state

    deep: list = []  # MAX_DEPTH + 1 lists, one inside the other
    for _ in range(MAX_DEPTH):
        deep = [deep]
    with pytest.raises(StateFileError, match=r"state(\[0\])+ nests deeper than 100 levels"):
        write_state(tmp_path / "t.json", deep)
    write_state(tmp_path / "t.json", deep[0])  # MAX_DEPTH levels: fine
    assert read_state(tmp_path / "t.json") == deep[0]
    for levels in (MAX_DEPTH + 1, DEEP):
        text = "[" * levels + "]" * levels
        (tmp_path / "t.json").write_text(
            f'{{"format": "rlsys.trainer_state", "version": 1, "state": {text}}}'
        )
        with pytest.raises(StateFileError, match="nested deeper than 100 levels"):
            read_state(tmp_path / "t.json")
