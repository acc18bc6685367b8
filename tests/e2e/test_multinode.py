"""A Ray cluster of three nodes on loopback (``ray start``: a head, a learner node and a
rollout node, each with its own custom resource), and ``rlsys submit launcher=ray_job`` on
it: the job runs, its pools land on the nodes they are pinned to, and status/stop work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loopback import AUTH, LoopbackCluster, Node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
RUN = [
    "warm_start.enabled=false",
    "trainer.eval_every=0",
    "eval.num_prompts=16",
    "task.eval_size=16",
    "sft.eval_prompts=16",
    "data.batch_size=8",
    "rollout.n_samples=4",
    "learner.world_size=1",
    "rollout.num_workers=1",
    "rollout.num_cpus_per_worker=1",
    "learner.num_cpus_per_rank=1",
    "placement=disaggregated",
    "placement.rollout_resources={rollout_nodes:1}",
    "placement.learner_resources={learner_nodes:1}",
]


@pytest.fixture(scope="module")
def cluster():
    started = LoopbackCluster(
        Node("head"),
        [Node(group, resources={group: 1}) for group in ("learner_nodes", "rollout_nodes")],
    )
    try:
        started.start()
        yield started
    finally:
        started.stop()


def _rlsys(*args: str, env: dict | None = None, timeout: float = 600):
    return subprocess.run(
        [sys.executable, "-m", "rlsys.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**AUTH, **(env or {})},
    )


def test_submitted_run_places_each_pool_on_its_node_group(cluster, tmp_path):
    result = _rlsys(
        "submit",
        "launcher=ray_job",
        f"cluster.address={cluster.dashboard}",
        f"run.output_dir={tmp_path}",
        "run.name=pinned",
        "trainer.total_steps=2",
        # the group forms across nodes under the job too (the stop test keeps the object store)
        "weight_sync.transport=collective",
        *RUN,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "submitted Ray job" in result.stdout and "SUCCEEDED" in result.stdout
    # the job ran the uploaded checkout, with cluster.address replaced by auto
    assert "python -m rlsys.cli train" in result.stdout
    assert "cluster.address=auto" in result.stdout
    assert "weight_sync.transport=collective" in result.stdout
    summary = json.loads((tmp_path / "pinned" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["accounting"]["balanced"]
    assert summary["nodes"]["rollout"] == [cluster.nodes["rollout_nodes"]]
    assert summary["nodes"]["learner"] == [cluster.nodes["learner_nodes"]]

    job_id = result.stdout.split("submitted Ray job ", 1)[1].split()[0]
    status = _rlsys("status", job_id, "launcher=ray_job", f"cluster.address={cluster.dashboard}")
    assert status.returncode == 0 and f"{job_id}: SUCCEEDED" in status.stdout
    # token authentication is on and honoured: a wrong token is refused
    refused = _rlsys(
        "status",
        job_id,
        "launcher=ray_job",
        f"cluster.address={cluster.dashboard}",
        env={"RAY_AUTH_TOKEN": "not-the-token"},
    )
    assert refused.returncode == 2 and "token" in refused.stderr.lower(), refused.stderr


def test_collective_sync_across_nodes_keeps_engines_greedy_equal_to_the_learner(cluster):
    """weight_sync.transport=collective with the learner and the engine on different nodes:
    the group forms across them, bytes go over gloo (shared memory needs one node), and after
    each sync the engine's greedy replies are the learner's. The check runs in a driver of its
    own: this process's Ray (other tests' ``ray_cpu``) cannot join the cluster."""
    overrides = [
        *RUN,
        "weight_sync.transport=collective",
        "weight_sync.cpu_data_plane=auto",  # must pick gloo: the engine is on another node
        "weight_sync.bucket_mb=0.05",
    ]
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sync_check.py")), cluster.gcs, str(ROOT)]
        + overrides,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**AUTH, "PYTHONPATH": pythonpath},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["planes"] == ["gloo"] * 3
    assert report["nodes"]["learner"] == [cluster.nodes["learner_nodes"]]
    assert report["nodes"]["rollout"] == [cluster.nodes["rollout_nodes"]]


def test_stop_ends_a_running_job(cluster, tmp_path):
    common = ["launcher=ray_job", f"cluster.address={cluster.dashboard}"]
    result = _rlsys(
        "submit",
        *common,
        "launcher.ray_job.follow=false",
        f"run.output_dir={tmp_path}",
        "run.name=stopped",
        "trainer.total_steps=200",
        "checkpoint.every=0",  # only the stop makes one
        *RUN,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    job_id = result.stdout.split("submitted Ray job ", 1)[1].split()[0]
    metrics = tmp_path / "stopped" / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and '"step": 1' in metrics.read_text()):
        assert time.monotonic() < deadline, "the job never trained a step"
        time.sleep(1)
    assert "RUNNING" in _rlsys("status", job_id, *common).stdout
    stopped = _rlsys("stop", job_id, *common)
    assert stopped.returncode == 0 and "stop requested" in stopped.stdout
    deadline = time.monotonic() + 120
    while f"{job_id}: STOPPED" not in _rlsys("status", job_id, *common).stdout:
        assert time.monotonic() < deadline, "the job did not stop"
        time.sleep(2)
    # the run got SIGTERM, finished its step and checkpointed before it ended
    summary = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert summary["preempted"] and summary["steps"] < 200
    assert (Path(summary["last_checkpoint"]) / "manifest.json").exists()
