"""Resize requests for a running run (``rlsys scale``), the plan the controller follows, and
the config checks of learner-group sizes."""

from __future__ import annotations

import fcntl
import json
import logging
import os

import pytest

from rlsys.cli import main
from rlsys.config.errors import ConfigError
from rlsys.config.loader import to_yaml
from rlsys.resolve import load_config, resized
from rlsys.trainers.rl.scale_requests import ScaleError, ScalePlan, request_scale

SMALL_BATCH = ["data.batch_size=2", "rollout.n_samples=2", "algorithm.filter_uniform_groups=false"]


@pytest.fixture
def live(tmp_path):
    """``tmp_path`` is a live run's directory: this process holds its lock, as the process
    that trains does (``<run_dir>/.lock``, flock)."""
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield tmp_path
    os.close(fd)


@pytest.fixture
def run_dir(live):
    (live / "config.yaml").write_text("run: {}\n")
    return live


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


def test_a_learner_request_keeps_an_untaken_rollout_request(live):
    run = _run_with(live, [])
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
def test_learner_requests_the_run_cannot_take_are_refused(live, overrides, target, needle):
    run = _run_with(live, overrides)
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


HUGE = "rollout=1000000"
AUTOSCALED = ["rollout.elastic.autoscale.enabled=true", "rollout.elastic.autoscale.max_workers=4"]


@pytest.mark.parametrize(
    ("overrides", "cluster", "target", "needle"),
    [
        (AUTOSCALED, None, HUGE, "rollout.elastic.autoscale.max_workers=4"),
        (
            [*AUTOSCALED, "rollout.elastic.autoscale.min_workers=2", "rollout.num_workers=2"],
            None,
            "rollout=1",
            "rollout.elastic.autoscale.min_workers=2",
        ),
        ([], {"CPU": 16.0}, HUGE, "rollout.num_cpus_per_worker"),
        ([], {"CPU": 16.0}, "learner=200", "learner.num_cpus_per_rank"),
        ([], None, HUGE, "hard cap of 64"),
    ],
    ids=["autoscale-max", "autoscale-min", "cluster-rollout", "cluster-learner", "hard-cap"],
)
def test_sizes_past_the_runs_bounds_are_refused_naming_the_limit(
    live, capsys, overrides, cluster, target, needle
):
    run = _run_with(live, overrides)
    if cluster is not None:  # what the run recorded when it joined Ray
        (run / "cluster.json").write_text(json.dumps({"resources": cluster}))
    assert main(["scale", str(run), target]) == 2
    err = capsys.readouterr().err
    assert needle in err and target.partition("=")[0] in err, err
    assert not (run / "scale.json").exists()


def test_a_size_within_the_recorded_cluster_is_taken(live, capsys):
    run = _run_with(live, [])
    (run / "cluster.json").write_text(json.dumps({"resources": {"CPU": 16.0}}))
    assert main(["scale", str(run), "rollout=3"]) == 0, capsys.readouterr().err


def test_a_request_the_cluster_cannot_hold_is_dropped_and_not_taken_after_a_resume(live, caplog):
    from rlsys.trainers.rl.scale_requests import check_sizes

    run = _run_with(live, [])
    cfg = load_config([])
    # written by hand, or by an rlsys before these checks: the run must not try it
    request = {"sizes": {"rollout": 1000000}, "requested_at": {"rollout": 1.0}}
    (run / "scale.json").write_text(json.dumps(request))

    def check(pool: str, size: int) -> None:  # the running controller's: the cluster now
        check_sizes(cfg, {"learner": 1, pool: size}, {"CPU": 16.0})

    with caplog.at_level(logging.WARNING):
        assert ScalePlan({}, run, check).poll(1) == {}
    assert "rollout=1000000" in caplog.text and "dropped" in caplog.text, caplog.text
    assert ScalePlan({}, run, check).poll(1) == {}  # the next resume does not take it either
    request_scale(run, ["rollout=3"])
    assert ScalePlan({}, run, check).poll(2) == {"rollout": (3, "rlsys scale")}


class _NoRoomPool:
    """A rollout pool whose new workers never start (the cluster has no room)."""

    workers = [object()]

    def grow(self, count: int, timeout_s: float):
        import ray

        raise ray.exceptions.GetTimeoutError("no room")


def test_a_grow_the_cluster_cannot_start_is_given_up_and_not_asked_after_a_resume(run_dir):
    import threading
    from types import SimpleNamespace

    from rlsys.config.elastic import ElasticConfig
    from rlsys.trainers.rl.scaling import RolloutScaler

    request_scale(run_dir, ["rollout=3"])
    plan = ScalePlan({}, run_dir)
    pipeline = SimpleNamespace(rollouts=[0], retired=lambda: [])
    state = SimpleNamespace(pipeline=pipeline, weights_lock=threading.Lock())
    pools = SimpleNamespace(rollout=_NoRoomPool())
    scaler = RolloutScaler(ElasticConfig(), pools, state, unmet=plan.unmet)
    scaler.after_step(1, plan.poll(1)["rollout"])
    assert scaler.target == 1  # stays at its size
    assert ScalePlan({}, run_dir).poll(1) == {}  # and a resume does not ask again
