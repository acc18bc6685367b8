"""README.md and docs/status.md agree on whether a capability has run or never has.

Each entry names a phrase of the README and the rows of docs/status.md about one capability.
The README's claim is "never" when the clause holding the phrase (text between `;`, a
sentence end or a table bar) says "never"; a status row's claim is "never" when its
"last run where" cell starts with "never". When a doc is reworded so that a phrase or row
is gone, the test fails naming it: update the list below with the new wording.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (README phrase, start of the docs/status.md capability cells about the same thing)
CAPABILITIES = [
    ("KubeRay manifests are", "KubeRay on a live cluster"),
    ("Docker images (linted, never built)", "Docker images: built or run"),
    ("single-node Slurm run in the tests", "Slurm, one node"),
    ("vLLM on a GPU", "vLLM on GPU"),
    ("two or more GPUs never have", "weight sync over NCCL"),
    ("CUDA IPC weight sync", "CUDA IPC"),
    ("the one-GPU check inside Ray", "rlsys inside Ray on one GPU"),
]


def readme_claim(readme: str, phrase: str) -> str | None:
    """'never' or 'ran' for the first README clause holding `phrase`; None if none does."""
    for clause in re.split(r"[.;]\s|\|", " ".join(readme.split())):
        if phrase in clause:
            return "never" if "never" in clause else "ran"
    return None


def status_claims(status: str, row_start: str) -> list[str]:
    """'never' or 'ran' for every docs/status.md table row whose first cell starts so."""
    claims = []
    for line in status.splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) >= 2 and cells[0].startswith(row_start):
            claims.append("never" if cells[1].startswith("never") else "ran")
    return claims


def disagreements(readme: str, status: str) -> list[str]:
    """What README and docs/status.md say differently, or a phrase or row they lack."""
    found = []
    for phrase, row_start in CAPABILITIES:
        said = readme_claim(readme, phrase)
        rows = status_claims(status, row_start)
        if said is None or not rows:
            found.append(f"README phrase {phrase!r} or status row {row_start!r} not found")
        elif any(claim != said for claim in rows):
            found.append(f"{phrase!r}: README says {said}, docs/status.md rows say {rows}")
    return found


def test_readme_and_status_agree_on_what_has_run():
    readme = (ROOT / "README.md").read_text()
    status = (ROOT / "docs" / "status.md").read_text()
    assert disagreements(readme, status) == []


def test_a_flipped_claim_is_caught():
    readme = (ROOT / "README.md").read_text()
    status = (ROOT / "docs" / "status.md").read_text()
    flipped = status.replace(
        "| Docker images: built or run | never |", "| Docker images: built or run | CI |"
    )
    assert flipped != status
    assert any("Docker images" in line for line in disagreements(readme, flipped))
