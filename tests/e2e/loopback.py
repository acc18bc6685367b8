"""Ray clusters of several nodes on this machine (``ray start`` on loopback), for tests that
need more than one node: nodes pinned by custom resources (test_multinode) or nodes with
logical GPUs (test_gpu_placement). Importable by that name: pytest puts tests/e2e on sys.path."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Token authentication stays on (Ray's default for a new head); nodes joining it must be told
# so, and find the token where the head left it (~/.ray/auth_token).
AUTH = {**os.environ, "RAY_AUTH_MODE": "token"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_cli(*args: str) -> None:
    ray = Path(sys.executable).with_name("ray")
    # the head's job supervisor waits this long after SIGTERM before SIGKILL (default 3 s):
    # time for a run to checkpoint when it is stopped
    env = {**AUTH, "RAY_JOB_STOP_WAIT_TIME_S": "120"}
    result = subprocess.run([str(ray), *args], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr[-3000:]


@dataclass
class Node:
    """One node's Ray resources: logical CPUs and GPUs, and custom resources."""

    name: str
    cpus: int = 1
    gpus: int = 0
    resources: dict[str, float] = field(default_factory=dict)

    def args(self) -> list[str]:
        out = [f"--num-cpus={self.cpus}", f"--num-gpus={self.gpus}"]
        if self.resources:
            out.append(f"--resources={json.dumps(self.resources)}")
        return out


class LoopbackCluster:
    """A head and worker nodes on this machine, each with its own temp dir (nodes sharing
    one would unpack a job's working directory over each other)."""

    def __init__(self, head: Node, workers: list[Node]) -> None:
        self.head, self.workers = head, workers
        self.root = Path(tempfile.mkdtemp(prefix="rlsys-mn-", dir="/tmp"))  # short: socket paths
        self.gcs = f"127.0.0.1:{free_port()}"
        self.dashboard = f"http://127.0.0.1:{free_port()}"
        self.nodes: dict[str, str] = {}  # custom resource -> node id

    def start(self) -> None:
        common = ["--disable-usage-stats", "--node-ip-address=127.0.0.1"]
        ray_cli(
            "start",
            "--head",
            f"--port={self.gcs.split(':')[1]}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
            f"--dashboard-agent-listen-port={free_port()}",  # not the default: it may be taken
            f"--temp-dir={self.root / self.head.name}",
            *self.head.args(),
            *common,
        )
        for node in self.workers:
            ray_cli(
                "start",
                f"--address={self.gcs}",
                f"--temp-dir={self.root / node.name}",
                "--dashboard-agent-listen-port=0",
                f"--metrics-export-port={free_port()}",
                *node.args(),
                *common,
            )
        self.nodes = self._wait_for_nodes(1 + len(self.workers))

    def _wait_for_nodes(self, count: int, timeout_s: float = 60.0) -> dict[str, str]:
        """Custom resource -> node id, once ``count`` nodes are alive."""
        probe = (
            f"import json, ray; ray.init(address={self.gcs!r}, logging_level='ERROR'); "
            "print(json.dumps([[n['NodeID'], n['Resources']] for n in ray.nodes() "
            "if n['Alive']]))"
        )
        deadline = time.monotonic() + timeout_s
        while True:
            out = subprocess.run(
                [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=AUTH
            )
            nodes = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else []
            if len(nodes) >= count or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert len(nodes) == count, out.stderr[-2000:]
        custom = {name for n in [self.head, *self.workers] for name in n.resources}
        return {
            name: node_id for node_id, resources in nodes for name in custom if name in resources
        }

    def stop(self) -> None:
        """Stop this cluster's processes and their children (agents rename themselves, so
        only their parents carry the temp dir); ``ray stop`` would stop every Ray here."""
        import psutil

        procs = []
        for proc in psutil.process_iter(["cmdline"]):
            if str(self.root) in " ".join(proc.info["cmdline"] or []):
                procs.append(proc)
                with contextlib.suppress(psutil.Error):
                    procs.extend(proc.children(recursive=True))
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)
