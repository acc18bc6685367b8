"""Resize requests for a running run (``rlsys scale``), the plan the controller follows, and
the config checks of learner-group sizes."""

from __future__ import annotations

import json

import pytest

from rlsys.cli import main
from rlsys.config.elastic import resized
from rlsys.config.errors import ConfigError
from rlsys.config.loader import load_config, to_yaml
from rlsys.trainers.rl.scale_requests import ScaleError, ScalePlan, request_scale

SMALL_BATCH = ["data.batch_size=2", "rollout.n_samples=2", "algorithm.filter_uniform_groups=false"]


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "config.yaml").write_text("run: {}\n")
    return tmp_path


def _run_with(tmp_path, overrides: list[str]):
    (tmp_path / "config.yaml").write_text(to_yaml(load_config(overrides)))
    return tmp_path


def test_schedule_then_a_request_then_the_schedule_again(run_dir):
    plan = ScalePlan({"rollout": {2: 3, 5: 1}}, run_dir)
    assert plan.poll(1) == {}
    assert plan.poll(2) == {"rollout": (3, "rollout.elastic.schedule at step 2")}
    assert plan.poll(3) == {}
    request_scale(run_dir, ["rollout=2"])
    assert plan.poll(3) == {"rollout": (2, "rlsys scale")}
    assert plan.poll(4) == {}  # a request is taken once
    assert plan.poll(5) == {"rollout": (1, "rollout.elastic.schedule at step 5")}
    request_scale(run_dir, ["rollout=4"])
    assert plan.poll(6) == {"rollout": (4, "rlsys scale")}


def test_a_request_made_before_a_resume_is_applied_again(run_dir):
    request_scale(run_dir, ["rollout=3"])
    assert ScalePlan({}, run_dir).poll(7) == {"rollout": (3, "rlsys scale")}


def test_without_a_run_dir_only_the_schedule_counts():
    plan = ScalePlan({"rollout": {}, "learner": {1: 2}}, None)
    assert plan.poll(1) == {"learner": (2, "learner.elastic.schedule at step 1")}


def test_a_learner_request_keeps_an_untaken_rollout_request(tmp_path):
    run = _run_with(tmp_path, [])
    plan = ScalePlan({}, run)
    request_scale(run, ["rollout=3"])
    line = request_scale(run, ["learner=1"])
    assert "requested learner=1" in line and "pool/learner_ranks" in line
    assert plan.poll(1) == {"rollout": (3, "rlsys scale"), "learner": (1, "rlsys scale")}
    request_scale(run, ["learner=2"])
    assert plan.poll(2) == {"learner": (2, "rlsys scale")}  # the rollout one was taken


def test_a_request_file_of_the_earlier_format_still_reads(run_dir):
    (run_dir / "scale.json").write_text(json.dumps({"sizes": {"rollout": 2}, "requested_at": 5.0}))
    assert ScalePlan({}, run_dir).poll(1) == {"rollout": (2, "rlsys scale")}


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("reference=4", "the pools that resize"),
        ("rollout=0", "1 or more"),
        ("rollout=many", "1 or more"),
        ("learner=0", "1 or more"),
    ],
)
def test_bad_requests_name_the_input_and_the_fix(run_dir, target, needle):
    with pytest.raises(ScaleError, match=needle):
        request_scale(run_dir, [target])
    assert not (run_dir / "scale.json").exists()


@pytest.mark.parametrize(
    ("overrides", "target", "needle"),
    [
        (["learner.backend=deepspeed"], "learner=1", "learner.backend=fsdp2"),
        (SMALL_BATCH, "learner=8", "cannot feed learner.world_size = 8 ranks"),
        ([], "critic=2", "runs no critic"),
    ],
)
def test_learner_requests_the_run_cannot_take_are_refused(tmp_path, overrides, target, needle):
    run = _run_with(tmp_path, overrides)
    with pytest.raises(ScaleError, match=needle):
        request_scale(run, [target])
    assert not (run / "scale.json").exists()


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["learner.elastic.schedule={3:0}"], "learner.elastic.schedule has 3: 0"),
        (["learner.backend=deepspeed", "learner.elastic.schedule={3:1}"], "universal format"),
        ([*SMALL_BATCH, "learner.elastic.schedule={3:8}"], "learner.elastic.schedule at step 3"),
        (["critic.elastic.schedule={3:2}"], "remove critic.elastic.schedule"),
    ],
)
def test_learner_schedules_are_checked_with_the_config(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(overrides)


def test_a_deepspeed_schedule_that_keeps_the_size_is_allowed_and_resized_checks_the_batch():
    cfg = load_config(["learner.backend=deepspeed", "learner.elastic.schedule={3:2}"])
    assert cfg.learner.elastic.schedule == {3: 2}
    cfg = load_config(["algorithm=ppo", "learner.world_size=1"])
    both = resized(cfg, {"learner": 2, "critic": 3})
    assert (both.learner.world_size, both.critic.world_size) == (2, 3)
    assert cfg.learner.world_size == 1  # a copy


def test_the_cli_refuses_what_is_not_a_running_run(tmp_path, capsys):
    assert main(["scale", str(tmp_path), "rollout=2"]) == 2
    assert "holds no config.yaml" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("run: {}\n")
    (tmp_path / "summary.json").write_text("{}")
    assert main(["scale", str(tmp_path), "rollout=2"]) == 2
    assert "has finished" in capsys.readouterr().err
