"""docs/config.md is generated from the schema and documents every key."""

from __future__ import annotations

from pathlib import Path

from rlsys.config.reference import render, sections

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_committed_reference_matches_the_schema():
    assert DOC.read_text() == render(), (
        "docs/config.md is stale: run `python -m rlsys.config.reference > docs/config.md`"
    )


def test_every_key_has_a_comment_and_a_default():
    rows = [row for _, _, section in sections() for row in section]
    keys = [key for key, *_ in rows]
    assert len(keys) == len(set(keys)) and len(keys) > 200
    missing = [key for key, _, _, comment in rows if not comment]
    assert not missing, f"fields without a comment in rlsys/config/: {missing}"
    assert "task.env.max_turns" in keys and "reward.sandbox.wall_s" in keys
    assert "critic.backend" in keys  # inherited fields keep their base's comment
