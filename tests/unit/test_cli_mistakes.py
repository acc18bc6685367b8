"""The CLI never swallows a mistake (issue 49): an added key that does not exist, flags among
the overrides, a program asked for a key it does not use, and a hub id that is misspelt or
unreachable each get a one-line answer in seconds, before Ray."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlsys.cli import main
from rlsys.config import ConfigError
from rlsys.resolve import load_config

ROOT = Path(__file__).resolve().parents[2]
FAST_S = 5.0


def test_an_added_key_that_does_not_exist_is_refused_with_the_closest_key():
    with pytest.raises(ConfigError) as info:
        load_config(["+learner.world_sizee=2"])
    assert "unknown config key 'learner.world_sizee'" in str(info.value)
    assert "did you mean 'learner.world_size'?" in str(info.value)
    with pytest.raises(ConfigError, match="unknown config key 'trainer.total_stepz'"):
        load_config(["++trainer.total_stepz=3"])


def test_added_keys_under_free_form_sections_still_go_in():
    cfg = load_config(["+launcher.kuberay.env.A=1", "+reward.extra.length=0.5"])
    assert cfg.launcher.kuberay.env == {"A": 1}
    assert cfg.reward.extra == {"length": 0.5}
    assert load_config(["++learner.world_size=1"]).learner.world_size == 1
    # a key of a free-form section needs no `+` (it was refused as unknown before)
    cfg = load_config(["reward.by_source.gsm8k=gsm8k", "launcher.kuberay.env.B=x"])
    assert cfg.reward.by_source == {"gsm8k": "gsm8k"}
    assert cfg.launcher.kuberay.env == {"B": "x"}


def test_flags_are_taken_anywhere_among_the_overrides(capsys):
    code = main(["submit", "launcher=kuberay", "--dry-run", "trainer.total_steps=2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "rlsys.cli train trainer.total_steps=2 " in out  # the job's entrypoint
    code = main(["train", "trainer.total_steps=5", "--cfg", "job", "trainer.eval_every=0"])
    out = capsys.readouterr().out
    assert code == 0 and "total_steps: 5" in out and "eval_every: 0" in out
    with pytest.raises(SystemExit):
        main(["train", "trainer.total_steps=5", "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_each_program_is_asked_only_for_the_keys_it_uses(capsys):
    small = ["task.eval_size=10", "eval.num_prompts=10"]  # sft.eval_prompts stays 200
    assert main(["eval", *small, "--cfg", "job"]) == 0
    assert "sft.eval_prompts" not in capsys.readouterr().err
    assert main(["sft", *small, "--cfg", "job"]) == 2
    assert "sft.eval_prompts=200 exceeds task.eval_size=10" in capsys.readouterr().err
    assert main(["eval", "task.eval_size=10", "--cfg", "job"]) == 2
    assert "lower eval.num_prompts" in capsys.readouterr().err


class _Hub(http.server.BaseHTTPRequestHandler):
    """A hub that knows no model: the 404 the real hub sends for a repository not found."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "Repository not found"}')

    def log_message(self, *args):
        pass


def _train_with_hub(tmp_path, endpoint: str) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(tmp_path / "hub"))
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rlsys.cli", "train", "model.path=HuggingFaceTB/SmolLM2-13M-Nope"]
        + [f"run.output_dir={tmp_path}/runs", "warm_start.enabled=false"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    return proc.returncode, proc.stderr, time.monotonic() - start


def test_a_misspelt_hub_id_fails_in_seconds_naming_the_key(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, err, took = _train_with_hub(tmp_path, f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    assert code == 2, err
    assert "model.path='HuggingFaceTB/SmolLM2-13M-Nope': no such model on the hub" in err
    assert "Traceback" not in err
    assert took < 3 * FAST_S, took  # the interpreter's start and imports included


def test_an_unreachable_hub_fails_within_its_timeout(tmp_path):
    silent = socket.socket()  # accepts connections (the backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        code, err, took = _train_with_hub(tmp_path, f"http://127.0.0.1:{silent.getsockname()[1]}")
    finally:
        silent.close()
    assert code == 2, err
    assert "the hub did not answer within 4 s" in err and "Traceback" not in err
    assert took < 3 * FAST_S, took
