"""scripts/setup.sh's first checks and its torch step, run for real: the interpreter check
with stand-in interpreters, and scripts/setup_torch.sh against package indexes served on
loopback that hold stand-in torch wheels (a CPU build, a CUDA build)."""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERSION = "2.13.0"


def _bash(script: str, *args: str, env: dict, timeout: float = 120):
    return subprocess.run(
        ["bash", str(REPO / "scripts" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=REPO,
    )


def _interpreter(tmp_path: Path, version: str) -> Path:
    """A stand-in ``python`` that reports ``version`` as sys.version_info."""
    major, minor = version.split(".")
    path = tmp_path / f"python{version}"
    path.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c "
        f"'import sys; sys.version_info = ({major}, {minor}, 0); exec(sys.argv[-1])' \"$2\"\n"
    )
    path.chmod(0o755)
    return path


def test_requires_python_agrees_with_setup():
    need = re.search(r"^NEED_PYTHON=(\S+)", (REPO / "scripts/setup.sh").read_text(), re.M)[1]
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert meta["requires-python"] == f">={need}"


@pytest.mark.parametrize("choice", ["old", "missing"])
def test_setup_refuses_a_wrong_interpreter_at_once(tmp_path, choice):
    python = _interpreter(tmp_path, "3.10") if choice == "old" else tmp_path / "no-such-python"
    venv = tmp_path / "venv"
    env = {**os.environ, "PYTHON": str(python), "RLSYS_VENV": str(venv)}
    start = time.monotonic()
    result = _bash("setup.sh", env=env, timeout=30)
    took = time.monotonic() - start
    assert result.returncode == 2, result.stdout + result.stderr
    assert took < 5, f"took {took:.1f} s"
    assert "needs Python >= 3.11" in result.stderr and "PYTHON=python3.11" in result.stderr
    if choice == "old":
        assert "is Python 3.10" in result.stderr
    assert not venv.exists(), "nothing is created before the interpreter is checked"


# --- the torch step ---------------------------------------------------------------------------


def _wheel(folder: Path, version: str, cuda: str | None) -> None:
    """A stand-in torch wheel: ``torch.__version__`` and ``torch.version.cuda`` only."""
    name = f"torch-{version}-py3-none-any.whl"
    dist = f"torch-{version}.dist-info"
    files = {
        "torch/__init__.py": f"from torch import version\n__version__ = {version!r}\n",
        "torch/version.py": f"cuda = {cuda!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}/RECORD"])
    project = folder / "torch"
    project.mkdir(parents=True)
    with zipfile.ZipFile(project / name, "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)
    href = name.replace("+", "%2B")
    (project / "index.html").write_text(f'<html><body><a href="{href}">{name}</a></body></html>')


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """``url(name)``: PEP 503 indexes on loopback: ``cpu`` serves torch VERSION+cpu (as
    PyTorch's CPU index does), ``cuda`` only the plain VERSION, a CUDA build (as PyPI does)."""
    root = tmp_path_factory.mktemp("indexes")
    _wheel(root / "cpu", f"{VERSION}+cpu", None)
    _wheel(root / "cuda", VERSION, "13.0")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield lambda name: f"http://127.0.0.1:{server.server_port}/{name}/"
    server.shutdown()


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """An empty venv with pip; the torch step installs into it."""
    path = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
    return path


def _torch_step(venv: Path, **env: str):
    """scripts/setup_torch.sh in ``venv`` with only the indexes given (no pip config)."""
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "uninstall", "-q", "-y", "torch"],
        capture_output=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "RLSYS_TORCH"))}
    path = f"{venv / 'bin'}{os.pathsep}{clean['PATH']}"
    full = {**clean, "PATH": path, "PIP_CONFIG_FILE": os.devnull, "PIP_RETRIES": "0", **env}
    result = _bash("setup_torch.sh", VERSION, env=full)
    build = subprocess.run(
        [str(venv / "bin/python"), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return result, build


def test_torch_step_takes_the_cpu_build_where_its_index_answers(venv, indexes):
    result, build = _torch_step(
        venv, RLSYS_TORCH_CPU_INDEX=indexes("cpu"), PIP_INDEX_URL=indexes("cuda")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert build == f"{VERSION}+cpu"
    assert "PyTorch's CPU wheel index" in result.stdout and "WARNING" not in result.stderr


def test_torch_step_falls_back_to_a_cuda_build_with_a_warning(venv, indexes):
    start = time.monotonic()
    result, build = _torch_step(
        venv, RLSYS_TORCH_CPU_INDEX="http://127.0.0.1:9/", PIP_INDEX_URL=indexes("cuda")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert build == VERSION
    assert "did not answer" in result.stdout
    assert "WARNING: only a CUDA build of torch 2.13.0 (CUDA 13.0)" in result.stderr
    assert "RLSYS_TORCH_INDEX" in result.stderr
    assert time.monotonic() - start < 60  # the unreachable index costs no retries


def test_torch_index_override_is_the_only_index_tried(venv, indexes):
    result, build = _torch_step(
        venv,
        RLSYS_TORCH_INDEX=indexes("cpu"),
        RLSYS_TORCH_CPU_INDEX="http://127.0.0.1:9/",
        PIP_INDEX_URL=indexes("cuda"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert build == f"{VERSION}+cpu"
    assert "from RLSYS_TORCH_INDEX" in result.stdout
