"""What every launcher shares and the Ray Jobs launcher's checks, without a cluster: the job's
command, the address and output-dir errors, and ``--dry-run`` (secrets masked)."""

from __future__ import annotations

import json

import pytest

from rlsys.cli import main
from rlsys.launch.base import job_overrides, train_command

ADDRESS = "cluster.address=http://127.0.0.1:8265"


def test_the_job_gets_the_run_overrides_only_and_joins_with_auto():
    overrides = [
        "launcher=ray_job",
        "launcher.ray_job.follow=false",
        "cluster.address=http://h:8265",
        "+launcher.kuberay.env.A=1",
        "trainer.total_steps=3",
        "placement.rollout_resources={r:1}",
    ]
    assert job_overrides(overrides) == [
        "trainer.total_steps=3",
        "placement.rollout_resources={r:1}",
        "cluster.address=auto",
    ]
    assert train_command(["a=1"]) == [
        "python",
        "-m",
        "rlsys.cli",
        "train",
        "a=1",
        "cluster.address=auto",
    ]


def test_ray_job_dry_run_prints_the_plan_with_secrets_masked(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-value")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    code = main(["submit", "--dry-run", "launcher=ray_job", ADDRESS, f"run.output_dir={tmp_path}"])
    assert code == 0
    out = capsys.readouterr().out
    assert "secret-value" not in out
    plan = json.loads(out)
    assert plan["address"] == "http://127.0.0.1:8265"
    assert plan["entrypoint"].startswith("python -m rlsys.cli train run.output_dir=")
    assert plan["entrypoint"].endswith("cluster.address=auto")
    assert plan["runtime_env"]["env_vars"] == {"WANDB_API_KEY": "***"}
    assert ".venv/" in plan["runtime_env"]["excludes"]


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["run.output_dir=outputs", ADDRESS], "run.output_dir='outputs' is relative"),
        (["cluster.address=ray://h:10001"], "not a dashboard address"),
        (["cluster.address=h:6379"], "not a dashboard address"),
        ([ADDRESS, "launcher.ray_job.working_dir=/no/such/dir"], "working_dir"),
    ],
)
def test_ray_job_errors_name_the_key_and_the_fix(tmp_path, capsys, overrides, needle):
    args = [f"run.output_dir={tmp_path}", *overrides]  # a later override wins
    assert main(["submit", "--dry-run", "launcher=ray_job", *args]) == 2
    assert needle in capsys.readouterr().err


def test_ray_job_without_any_address_says_where_to_give_it(tmp_path, capsys, monkeypatch):
    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    assert main(["submit", "--dry-run", "launcher=ray_job", f"run.output_dir={tmp_path}"]) == 2
    assert "cluster.address=http://<head>:8265" in capsys.readouterr().err


def test_an_unreachable_cluster_is_a_clear_error(capsys):
    free = "cluster.address=http://127.0.0.1:9"  # the discard port: nothing answers
    assert main(["status", "raysubmit_x", "launcher=ray_job", free]) == 2
    assert "cannot reach the Ray Jobs API at http://127.0.0.1:9" in capsys.readouterr().err


def test_local_launcher_dry_run_is_the_train_command(capsys):
    assert main(["submit", "--dry-run", "trainer.total_steps=3"]) == 0
    assert capsys.readouterr().out.strip() == "rlsys train trainer.total_steps=3"
