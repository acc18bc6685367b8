"""What the security tests look for in the process table."""

from __future__ import annotations

import os
from pathlib import Path


def processes_with(marker: str) -> list[str]:
    """The pids of every process whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(pid)
    return found
