"""Resize requests for a running run (``rlsys scale``) and the plan the controller follows."""

from __future__ import annotations

import pytest

from rlsys.cli import main
from rlsys.trainers.rl.scale_requests import ScaleError, ScalePlan, request_scale


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "config.yaml").write_text("run: {}\n")
    return tmp_path


def test_schedule_then_a_request_then_the_schedule_again(run_dir):
    plan = ScalePlan({2: 3, 5: 1}, run_dir)
    assert plan.poll(1) is None
    assert plan.poll(2) == (3, "rollout.elastic.schedule at step 2")
    assert plan.poll(3) is None
    request_scale(run_dir, ["rollout=2"])
    assert plan.poll(3) == (2, "rlsys scale")
    assert plan.poll(4) is None  # a request is taken once
    assert plan.poll(5) == (1, "rollout.elastic.schedule at step 5")
    request_scale(run_dir, ["rollout=4"])
    assert plan.poll(6) == (4, "rlsys scale")


def test_a_request_made_before_a_resume_is_applied_again(run_dir):
    request_scale(run_dir, ["rollout=3"])
    assert ScalePlan({}, run_dir).poll(7) == (3, "rlsys scale")


def test_without_a_run_dir_only_the_schedule_counts():
    assert ScalePlan({1: 2}, None).poll(1) == (2, "rollout.elastic.schedule at step 1")


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("learner=4", "only the rollout pool"),
        ("rollout=0", "1 or more"),
        ("rollout=many", "1 or more"),
    ],
)
def test_bad_requests_name_the_input_and_the_fix(run_dir, target, needle):
    with pytest.raises(ScaleError, match=needle):
        request_scale(run_dir, [target])
    assert not (run_dir / "scale.json").exists()


def test_the_cli_refuses_what_is_not_a_running_run(tmp_path, capsys):
    assert main(["scale", str(tmp_path), "rollout=2"]) == 2
    assert "holds no config.yaml" in capsys.readouterr().err
    (tmp_path / "config.yaml").write_text("run: {}\n")
    (tmp_path / "summary.json").write_text("{}")
    assert main(["scale", str(tmp_path), "rollout=2"]) == 2
    assert "has finished" in capsys.readouterr().err
