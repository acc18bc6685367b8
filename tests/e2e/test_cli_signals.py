"""Ctrl-C during start-up: `rlsys train` interrupted at several moments (before Ray, as Ray
comes up, while the pools start) exits 130 with its one-line message, never a crash, and leaves
no Ray process behind. Before the fix, 2 of 12 interrupts around the pools' start segfaulted
(rc -11) as the interpreter tore Ray down under start-up threads still inside Ray calls."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
RUN = ["warm_start.enabled=false", "trainer.total_steps=3", "trainer.eval_every=0"]
# (the stderr line to wait for, seconds after it): before Ray, Ray just up, pools starting
MOMENTS = [
    ("run directory:", 0.0),
    ("Started a local Ray instance", 0.0),
    ("Started a local Ray instance", 0.7),
    ("Started a local Ray instance", 1.5),
]


def _interrupt_at(tmp_path: Path, marker: str, after_s: float) -> tuple[int, str]:
    # this run's Ray processes are the ones naming it (short: Ray's socket paths must fit)
    ray_tmp = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlsys.cli", "train", *RUN, f"run.output_dir={tmp_path}/runs"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env={**os.environ, "RAY_TMPDIR": str(ray_tmp)},
    )
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if marker in line:
            break
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    lines += proc.stderr.readlines()
    code = proc.wait(timeout=120)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = [
            p.pid
            for p in psutil.process_iter(["cmdline"])
            if str(ray_tmp) in " ".join(p.info["cmdline"] or [])
        ]
        if not left:
            break
        time.sleep(0.5)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not left, f"Ray processes left behind: {left}"
    return code, "".join(lines)


@pytest.mark.parametrize(("marker", "after_s"), MOMENTS)
def test_ctrl_c_at_start_up_exits_130_without_a_crash(tmp_path, marker, after_s):
    code, err = _interrupt_at(tmp_path, marker, after_s)
    assert code == 130, err[-3000:]
    assert "rlsys train: interrupted" in err and "Traceback" not in err, err[-3000:]
