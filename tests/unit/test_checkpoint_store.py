"""Checkpoint directories: atomic save, manifest checks, pruning, resume resolution; the
buffer's drained state round trip; metrics.jsonl trimmed on resume."""

from __future__ import annotations

import json
import os
import random
import threading
import time

import numpy as np
import pytest

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.checkpoint.store import (
    CheckpointError,
    CheckpointStore,
    problem,
    read_trainer_state,
    resolve_resume,
    step_of,
    write_trainer_state,
)
from rlsys.run.directory import trim_metrics
from rlsys.types import Completion, Prompt, RolloutGroup, Sample


def _write(payload: str):
    def write(tmp):
        (tmp / "policy").mkdir()
        (tmp / "policy" / "shard.bin").write_text(payload)
        write_trainer_state(tmp, {"payload": payload})

    return write


def test_save_is_atomic_and_keeps_the_last_n(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints", keep=2)
    for step in (10, 20, 30):
        path = store.save(step, _write(f"s{step}"))
        assert path.name == f"step_{step:06d}" and problem(path) is None
    assert [step_of(p) for p in store.complete()] == [30, 20]
    assert read_trainer_state(store.latest()) == {"payload": "s30"}
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_a_failed_save_leaves_the_previous_checkpoint_in_place(tmp_path):
    store = CheckpointStore(tmp_path / "checkpoints", keep=2)
    store.save(10, _write("ok"))

    def crash(tmp):
        (tmp / "trainer.json").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        store.save(20, crash)
    assert [step_of(p) for p in store.complete()] == [10]


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
        (lambda p: (p / "manifest.json").write_text("{not json"), "unreadable manifest"),
        (lambda p: (p / "policy" / "shard.bin").unlink(), "policy/shard.bin is missing"),
        (lambda p: (p / "trainer.json").write_bytes(b"cut"), "trainer.json has 3 bytes"),
        (lambda p: (p / "manifest.json").write_text('{"files": [1]}'), "unreadable manifest"),
        (
            lambda p: (p / "manifest.json").write_text("[" * 100_000 + "]" * 100_000),
            "unreadable manifest",
        ),
    ],
)
def test_damaged_checkpoints_are_detected_and_skipped(tmp_path, damage, reason):
    store = CheckpointStore(tmp_path / "checkpoints", keep=3)
    store.save(1, _write("old"))
    newest = store.save(2, _write("new"))
    damage(newest)
    assert reason in problem(newest)
    assert [step_of(p) for p in store.complete()] == [1]


def test_unreadable_trainer_state_names_the_file(tmp_path):
    (tmp_path / "trainer.json").write_bytes(b"\x80\x05garbage")
    with pytest.raises(CheckpointError, match="trainer.json is unreadable"):
        read_trainer_state(tmp_path)
    (tmp_path / "trainer.json").write_text('{"format": "rlsys.trainer_state", "version": 99}')
    with pytest.raises(CheckpointError, match="format version 99; this rlsys reads version 1"):
        read_trainer_state(tmp_path)


def test_resume_auto_picks_the_run_with_the_newest_checkpoint(tmp_path):
    old = CheckpointStore(tmp_path / "run-a" / "checkpoints", 2)
    old.save(5, _write("a"))
    time.sleep(0.02)
    new = CheckpointStore(tmp_path / "run-b" / "checkpoints", 2)
    new.save(3, _write("b"))
    (tmp_path / "run-c" / "checkpoints").mkdir(parents=True)  # no complete checkpoint
    assert resolve_resume("auto", str(tmp_path), None) == (tmp_path / "run-b", None)
    assert resolve_resume("auto", str(tmp_path), "run-a") == (tmp_path / "run-a", None)
    assert resolve_resume("auto", str(tmp_path), "run-c") is None
    assert resolve_resume("auto", str(tmp_path / "nothing"), None) is None
    chosen = tmp_path / "run-a" / "checkpoints" / "step_000005"
    assert resolve_resume(str(chosen), str(tmp_path), None) == (tmp_path / "run-a", chosen)
    with pytest.raises(CheckpointError, match="not a run directory"):
        resolve_resume(str(tmp_path / "elsewhere"), str(tmp_path), None)


def test_resume_auto_over_only_damaged_checkpoints_is_an_error(tmp_path):
    """It neither starts a fresh run over them (which would prune them and mix two runs'
    metrics) nor picks another run."""
    store = CheckpointStore(tmp_path / "run-a" / "checkpoints", 2)
    for step in (1, 2):
        (store.save(step, _write("a")) / "manifest.json").unlink()
    for run_name in ("run-a", None):
        with pytest.raises(CheckpointError, match="step_000002.*step_000001.*move the run"):
            resolve_resume("auto", str(tmp_path), run_name)
    assert len(store.saved()) == 2


def test_trim_metrics_drops_later_steps_and_torn_lines(tmp_path):
    lines = [json.dumps({"step": s}) for s in range(6)] + ['{"step": 6, "loss"']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    assert trim_metrics(tmp_path, 3) == 3
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]


def _group(version: int, uid: int) -> RolloutGroup:
    prompt = Prompt(uid=uid, text="1+1=", answer="2")
    completion = Completion([1, 2], [-0.1, -0.2], "stop", version)
    return RolloutGroup(prompt, [Sample(prompt, [3], completion, "2", reward=1.0)])


def test_buffer_state_round_trip_after_pause_and_drain():
    buffer = StreamingBuffer(batch_size=2, group_size=1, max_staleness=1)
    assert buffer.reserve(4) == 4  # (0 steps + 1 + 1) x 2 groups
    for uid in range(3):
        buffer.put(_group(0, uid))
    buffer.pause()
    drained = threading.Event()
    waiter = threading.Thread(target=lambda: buffer.wait_drained() and drained.set())
    waiter.start()
    assert not drained.wait(0.2)  # one group still in flight
    with pytest.raises(RuntimeError, match="in flight"):
        buffer.state_dict()
    buffer.cancel(1, "failed")
    waiter.join(5)
    assert drained.is_set()
    state = buffer.state_dict()
    restored = StreamingBuffer(batch_size=2, group_size=1, max_staleness=1)
    restored.load_state_dict(state)
    assert restored.accounting() == buffer.accounting()
    assert [g.prompt.uid for g in restored.take(2)] == [0, 1]
    # paused: no reservation is granted until resume
    granted = []
    feeder = threading.Thread(target=lambda: granted.append(buffer.reserve(1)))
    buffer.take(2)
    buffer.step_done(1)
    feeder.start()
    time.sleep(0.2)
    assert granted == []
    buffer.resume()
    feeder.join(5)
    assert granted == [1]


def test_checkpoint_dir_is_fsynced_before_rename(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    store = CheckpointStore(tmp_path / "checkpoints", keep=1)
    path = store.save(1, _write("x"))
    tmp_name = ".tmp-step_000001"
    assert any(p.endswith(f"{tmp_name}/trainer.json") for p in synced)
    assert any(p.endswith(f"{tmp_name}/manifest.json") for p in synced)
    assert synced[-1] == str(path.parent)  # the rename itself is made durable


def test_export_refuses_an_incomplete_checkpoint(tmp_path, capsys):
    from rlsys.cli import main

    store = CheckpointStore(tmp_path / "checkpoints", keep=1)
    path = store.save(1, _write("x"))
    (path / "manifest.json").unlink()
    assert main(["export", str(path), str(tmp_path / "out")]) == 2
    assert "no manifest.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _controller_state(step: int, run_info: dict) -> dict:
    """The smallest controller state a run saves after ``step`` (``Recovery.state_dict``'s
    keys; tests/unit/test_saved_state.py checks the real one)."""
    return {
        "version": step,
        "totals": {"steps": step},
        "marks": [0, 0],
        "buffer": {
            "stats": {"issued": 0, "admitted": 0, "released": 0, "dropped": {}},
            **{"version": step, "steps": step, "issued": 0, "dropped": {}, "groups": []},
        },
        "sampler": {"epoch": 0, "position": 0},
        "pipeline": {"drawn": 0, "calls": [0], "continued": [0]},
        "kl_coef": 0.0,
        "collector": {"reward_errors": 0, "skipped_prompts": 0},
        "rng": {"python": random.getstate(), "numpy": np.random.get_state()},
        "run_info": run_info,
    }


def _run_with_checkpoints(tmp_path, steps: tuple[int, ...]) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "run" / "checkpoints", 3)
    for step in steps:
        state = _controller_state(step, {"s": step})
        store.save(step, lambda tmp, state=state: write_trainer_state(tmp, state))
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    return store


def test_resume_falls_back_past_an_unreadable_trainer_state(tmp_path):
    """The newest checkpoint is complete (sizes match its manifest) but its controller state
    does not parse: resume starts from the previous one."""
    from rlsys.commands.train import _resume_point
    from rlsys.resolve import load_config

    store = _run_with_checkpoints(tmp_path, (1, 2))
    newest = store.latest() / "trainer.json"
    newest.write_bytes(b"x" * newest.stat().st_size)
    cfg = load_config([f"run.output_dir={tmp_path}", "run.name=run", "resume=auto"])
    run_dir, candidates, run_info = _resume_point(cfg)
    assert run_dir == tmp_path / "run"
    assert [step_of(p) for p in candidates] == [1] and run_info == {"s": 1}

    older = store.saved()[1] / "trainer.json"
    older.write_bytes(b"{}".ljust(older.stat().st_size))
    newest.write_bytes(b"x" * newest.stat().st_size)
    with pytest.raises(CheckpointError, match="no checkpoint of .* loads.*nothing was changed"):
        _resume_point(cfg)
    assert len(store.saved()) == 2


def test_a_fresh_run_never_reuses_a_directory_that_holds_a_run(tmp_path):
    from rlsys.config.errors import ConfigError
    from rlsys.resolve import load_config
    from rlsys.run.directory import make_run_dir

    _run_with_checkpoints(tmp_path, (1,))
    cfg = load_config([f"run.output_dir={tmp_path}", "run.name=run"])
    with pytest.raises(ConfigError, match="already holds a run .*resume=auto to continue it"):
        make_run_dir(cfg)
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("step") == 2

    # resume=auto over a run that never checkpointed: it starts over there, old records gone
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "metrics.jsonl").write_text('{"step": 1}\n')
    cfg = load_config([f"run.output_dir={tmp_path}", "run.name=fresh", "resume=auto"])
    assert make_run_dir(cfg, restart=True) == tmp_path / "fresh"
    assert (tmp_path / "fresh" / "metrics.jsonl").read_text() == ""


@pytest.mark.parametrize("stray", ["file", "dir symlink", "file symlink", "dangling symlink"])
def test_a_stray_tmp_entry_neither_blocks_a_save_nor_is_followed(tmp_path, stray):
    """A ``.tmp-step_<N>`` that is a file or a symlink (a crash, a copy, a hand) is removed
    at save (a symlink itself, never what it points to) instead of failing the save with
    FileExistsError, and so are stray ones of other steps."""
    root = tmp_path / "checkpoints"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the checkpoint's")
    for name in (".tmp-step_000001", ".tmp-step_000007"):
        entry = root / name
        if stray == "file":
            entry.write_text("left over")
        elif stray == "dir symlink":
            entry.symlink_to(outside, target_is_directory=True)
        elif stray == "file symlink":
            entry.symlink_to(outside / "keep.txt")
        else:
            entry.symlink_to(tmp_path / "gone")
    store = CheckpointStore(root, keep=2)
    path = store.save(1, _write("x"))
    assert problem(path) is None and not path.is_symlink()
    assert read_trainer_state(path) == {"payload": "x"}
    assert sorted(p.name for p in root.iterdir()) == ["step_000001"]
    assert (outside / "keep.txt").read_text() == "not the checkpoint's"
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


def test_a_tmp_directory_is_never_resumed(tmp_path):
    """A complete-looking ``.tmp-step_<N>`` (a save that crashed after its manifest, or a
    copy) is not a checkpoint: resume and export see only ``step_<N>`` directories."""
    store = CheckpointStore(tmp_path / "run" / "checkpoints", keep=2)
    store.save(1, _write("done"))
    os.rename(store.save(2, _write("tmp")), store.root / ".tmp-step_000002")
    assert [step_of(p) for p in store.complete()] == [1]
    assert resolve_resume("auto", str(tmp_path), None) == (tmp_path / "run", None)
    assert read_trainer_state(store.latest()) == {"payload": "done"}
