"""One owner per run directory: the process that trains holds ``<run_dir>/.lock`` (flock), so a
second ``rlsys train`` (or sft, rm, dpo) on that directory exits 2 before Ray starts, naming the
holder; a crashed holder's lock is free, so its run resumes; ``rlsys scale`` tells a live run
from a dead one by the same lock. The holder here is another process that takes the lock as the
docs describe it and sleeps."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from rlsys.cli import main
from rlsys.commands.sft import sft
from rlsys.config.loader import to_yaml
from rlsys.launch import local
from rlsys.resolve import load_config
from rlsys.run.doctor_checks import TRAIN_OVERRIDES

HOLD = """
import fcntl, json, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": "2026-01-01T00:00:00"}
os.ftruncate(fd, 0)
os.write(fd, json.dumps(holder).encode())
print("held", flush=True)
time.sleep(60)
"""


@pytest.fixture
def hold():
    """``hold(run_dir) -> Popen``: another process holding ``run_dir``'s lock until killed."""
    procs: list[subprocess.Popen] = []

    def start(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(run_dir / ".lock")], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


class RayStarted(Exception):
    """The command got past its checks to starting Ray."""


def _no_ray(*args, **kwargs):
    raise RayStarted


def _fake_checkpoint(run_dir) -> None:
    """A checkpoint ``resume=auto`` finds (complete by its manifest)."""
    step = run_dir / "checkpoints" / "step_3"
    step.mkdir(parents=True)
    (step / "manifest.json").write_text(json.dumps({"files": {}}))


@pytest.mark.parametrize(
    ("command", "checkpointed"),
    [("train", True), ("train", False), ("sft", False), ("dpo", False)],
    ids=["train-resume", "train-fresh", "sft", "dpo"],
)
def test_a_second_run_on_a_held_directory_exits_2_before_ray_starts(
    tmp_path, hold, monkeypatch, capsys, command, checkpointed
):
    run = tmp_path / "r"
    if checkpointed:
        _fake_checkpoint(run)
    holder = hold(run)
    monkeypatch.setattr(local, "connect_ray", _no_ray)
    overrides = [f"run.output_dir={tmp_path}", "run.name=r"]
    if command == "train":
        overrides.append("resume=auto")
    assert main([command, *TRAIN_OVERRIDES, *overrides]) == 2
    err = capsys.readouterr().err
    assert f"pid {holder.pid}" in err and socket.gethostname() in err, err
    assert "run.name" in err and "wait for that run" in err.lower(), err
    assert "config error" not in err
    assert sorted(p.name for p in run.iterdir()) == [".lock", "checkpoints"][: 1 + checkpointed]


def test_a_fresh_run_over_a_live_one_names_the_holder_and_changes_nothing(
    tmp_path, hold, monkeypatch, capsys
):
    run = tmp_path / "r"
    holder = hold(run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    before = sorted((p.name, p.read_bytes()) for p in run.iterdir())
    monkeypatch.setattr(local, "connect_ray", _no_ray)
    assert main(["train", *TRAIN_OVERRIDES, f"run.output_dir={tmp_path}", "run.name=r"]) == 2
    err = capsys.readouterr().err
    assert f"pid {holder.pid}" in err and "wait for that run" in err.lower(), err
    assert sorted((p.name, p.read_bytes()) for p in run.iterdir()) == before


def test_a_crashed_runs_lock_is_free_so_it_resumes(tmp_path, hold):
    from rlsys.run.directory import make_run_dir

    run = tmp_path / "r"
    holder = hold(run)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    cfg = load_config([f"run.output_dir={tmp_path}", "run.name=r", "resume=auto"])
    assert make_run_dir(cfg, restart=True) == run
    mine = json.loads((run / ".lock").read_text())
    assert (mine["pid"], mine["host"]) == (os.getpid(), socket.gethostname())


def test_the_lock_is_released_when_the_command_returns(tmp_path, monkeypatch):
    """In one process (tests, notebooks) a command that ended leaves the directory free."""
    monkeypatch.setattr(local, "connect_ray", _no_ray)
    cfg = load_config([*TRAIN_OVERRIDES, f"run.output_dir={tmp_path}", "run.name=r"])
    with pytest.raises(RayStarted):
        sft(cfg)
    probe = subprocess.run(
        [sys.executable, "-c", HOLD.replace("time.sleep(60)", ""), str(tmp_path / "r" / ".lock")],
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr  # another process takes it at once


def _config(run_dir) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(load_config([])))


@pytest.mark.parametrize("holder", ["never", "crashed"])
def test_scale_refuses_a_directory_no_live_run_holds(tmp_path, hold, capsys, holder):
    run = tmp_path / "r"
    _config(run)  # any folder with a config.yaml, or a run whose process died
    if holder == "crashed":
        proc = hold(run)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert main(["scale", str(run), "rollout=2"]) == 2
    err = capsys.readouterr().err
    assert "not a live run" in err and ".lock" in err, err
    assert not (run / "scale.json").exists()


def test_scale_takes_a_request_for_a_live_run(tmp_path, hold, capsys):
    run = tmp_path / "r"
    _config(run)
    hold(run)
    assert main(["scale", str(run), "rollout=2"]) == 0, capsys.readouterr().err
    assert json.loads((run / "scale.json").read_text())["sizes"] == {"rollout": 2}
