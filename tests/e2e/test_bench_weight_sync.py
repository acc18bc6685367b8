"""The weight-sync benchmark runs end to end and writes the records the docs table comes from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_weight_sync.py"
KEYS = {"transport", "params", "bytes", "seconds", "gbps", "ratio_to_memcpy"}


def test_bench_weight_sync_writes_a_record_per_transport(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--models", "3M", "--repeats", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "memory-copy bandwidth" in result.stdout
    records = json.loads(out.read_text())
    assert {r["transport"] for r in records} == {
        "object_store",
        "collective:shm",
        "collective:shm_resident",
        "collective:gloo",
    }
    for record in records:
        assert set(record) >= KEYS
        assert record["params"] > 2_500_000 and record["bytes"] == 4 * record["params"]
        assert record["seconds"] > 0 and record["gbps"] > 0 and record["ratio_to_memcpy"] > 0
