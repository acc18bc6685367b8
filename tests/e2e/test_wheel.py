"""The built wheel runs with no checkout beside it (issue 49): the presets and the Slurm
template ship inside the package (``setup.py``, ``rlsys.config.shipped``). The wheel is built
from a copy of the sources, installed non-editable into a fresh venv (its dependencies come
from this interpreter's site-packages through a .pth, so nothing is downloaded), and its
``rlsys`` command trains 2 steps from a folder with no conf/ and refuses a bad key."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "rlsys",
    "conf",
    "scripts/slurm",
)


def _run(cmd: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode in (0, 2), f"{cmd}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its bin/ folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        path = ROOT / name
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src], tmp)
    (wheel,) = (tmp / "dist").glob("rlsys-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    site = _run([python, "-c", "import site; print(site.getsitepackages()[0])"], tmp)
    deps = sysconfig.get_paths()["purelib"]  # this venv's packages, as plain paths
    Path(site.stdout.strip(), "rlsys_deps.pth").write_text(f"{deps}\n")
    _run([*pip, "--python", python, "install", "-q", "--no-deps", "--no-index", wheel], tmp)
    return venv / "bin"


def _env() -> dict:
    drop = ("RLSYS_CONF_DIR", "PYTHONPATH", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop}


def test_the_wheel_carries_its_presets_and_trains(installed, tmp_path):
    where = _run(
        [installed / "python", "-c", "import rlsys.config.loader as l; print(l.conf_dir())"],
        tmp_path,
        _env(),
    ).stdout.strip()
    assert where.endswith("site-packages/rlsys/_shipped/conf"), where
    cmd = [installed / "rlsys", "train", "trainer.total_steps=2", "trainer.eval_every=0"]
    cmd += ["warm_start.enabled=false", f"run.output_dir={tmp_path}/runs"]
    proc = _run(cmd, tmp_path, _env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    (summary,) = (tmp_path / "runs").glob("*/summary.json")
    assert json.loads(summary.read_text())["steps"] == 2


def test_the_wheel_refuses_a_bad_key(installed, tmp_path):
    proc = _run([installed / "rlsys", "train", "learner.world_sizee=2"], tmp_path, _env())
    assert proc.returncode == 2
    assert "did you mean 'learner.world_size'?" in proc.stderr and "Traceback" not in proc.stderr


def test_the_wheel_renders_the_slurm_script(installed, tmp_path):
    cmd = [installed / "rlsys", "submit", "launcher=slurm", "--dry-run"]
    proc = _run(cmd, tmp_path, _env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "#SBATCH" in proc.stdout
