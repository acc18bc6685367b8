"""The wheelhouse path for a GPU machine with no package index (docs/launching.md): a fresh
venv holding only what such an image holds (torch, transformers and the usual scientific
stack), the wheelhouse ``scripts/wheelhouse.sh`` builds here installed into it with
``--no-index``, and the one-GPU check's CPU half run from it. Long tier: it builds a venv."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.long, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
# What a CUDA image of torch + transformers already holds that rlsys uses (the lent GPU
# machine's image has all of these; docs/launching.md)
IMAGE = [
    "transformers", "tokenizers", "safetensors", "huggingface-hub", "numpy", "pyyaml",
    "requests", "click", "filelock", "msgpack", "protobuf", "packaging", "psutil",
    "accelerate", "peft", "pillow", "pyarrow", "tensorboard", "matplotlib", "sympy", "jinja2",
    "tqdm", "einops", "py-cpuinfo", "ninja", "attrs", "typing-extensions", "aiohttp", "grpcio",
]  # fmt: skip


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result


def test_a_wheelhouse_installs_offline_and_the_gpu_checks_cpu_half_runs(tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    torch = (ROOT / "constraints.txt").read_text().split("torch==")[1].split()[0]
    _run([python, "-m", "pip", "install", "-q", f"torch=={torch}"], timeout=900)
    constraints = ["-c", str(ROOT / "constraints.txt")]
    _run([python, "-m", "pip", "install", "-q", *constraints, *IMAGE], timeout=900)
    wheels = tmp_path / "wheels"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    _run(
        ["bash", str(ROOT / "scripts" / "wheelhouse.sh"), str(wheels)],
        env={**os.environ, "PYTHON_VERSION": version},
        cwd=ROOT,
        timeout=600,
    )
    site = tmp_path / "site"
    _run(
        [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
        + [str(w) for w in sorted(wheels.glob("*.whl"))],
        timeout=600,
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{site}"}
    env.pop("VIRTUAL_ENV", None)
    result = _run(
        [python, str(ROOT / "scripts" / "gpu_check.py"), "--cpu", "--out", str(tmp_path / "gc")]
        + ["--only", "ray,placement,sync,grpo"],
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert "gpu_check: 0 failed" in result.stdout, result.stdout[-2000:]
