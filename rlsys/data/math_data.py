"""Converters from public math datasets to the project's file-task rows.

A project row is ``{"prompt": str, "answer": str, ...extras}`` (``task.prompt_key`` /
``task.answer_key`` defaults; extras reach rewards as ``Prompt.meta``). Known formats:

* ``gsm8k``: ``{"question", "answer"}`` where the answer is a worked solution ending in a
  ``#### 42`` line -> answer ``"42"`` (commas removed), the worked text kept as ``solution``.
* ``math`` (MATH, MATH-500): ``{"problem", "solution", "answer"?, "level"?, "type"/"subject"?}``
  -> answer is ``answer`` when given, else the last ``\\boxed{}`` of the solution.

Other columns are kept. Rows that cannot be converted are skipped and counted.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlsys.data.boxed import last_boxed


def gsm8k_row(row: dict) -> dict | None:
    """A GSM8K row as a project row, or None without a question or a ``####`` answer."""
    question, worked = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not isinstance(worked, str) or "####" not in worked:
        return None
    solution, final = worked.rsplit("####", 1)
    answer = final.strip().replace(",", "").rstrip(".")
    if not answer:
        return None
    extras = {k: v for k, v in row.items() if k not in ("question", "answer")}
    return {"prompt": question, "answer": answer, **extras, "solution": solution.strip()}


def math_row(row: dict) -> dict | None:
    """A MATH / MATH-500 row as a project row, or None without a problem or an answer."""
    problem, solution, given = row.get("problem"), row.get("solution"), row.get("answer")
    if not isinstance(problem, str):
        return None
    if given is not None and not isinstance(given, (dict, list)) and str(given).strip():
        answer = str(given).strip()
    else:
        answer = last_boxed(solution) if isinstance(solution, str) else None
    if not answer:
        return None
    extras = {k: v for k, v in row.items() if k not in ("problem", "answer")}
    return {"prompt": problem, "answer": answer, **extras}


@dataclass(frozen=True)
class SourceFormat:
    """A public format: the keys that identify it and its row converter."""

    keys: frozenset[str]
    convert: Callable[[dict], dict | None]


FORMATS: dict[str, SourceFormat] = {
    "gsm8k": SourceFormat(frozenset({"question", "answer"}), gsm8k_row),
    "math": SourceFormat(frozenset({"problem", "solution"}), math_row),
}


def detect_format(rows: list[dict]) -> str:
    """The format of the first row whose keys identify one; fails listing the keys found."""
    for row in rows:
        for name, fmt in FORMATS.items():
            if fmt.keys <= row.keys():
                return name
    seen = sorted({key for row in rows for key in row})
    known = "; ".join(f"{name}: {sorted(fmt.keys)}" for name, fmt in FORMATS.items())
    raise ValueError(
        f"cannot tell the dataset's format from its keys {seen}; known formats and the keys "
        f"they need: {known}. Rename the columns or pass --format"
    )


@dataclass
class Conversion:
    """Converted rows, with how many source rows were skipped."""

    rows: list[dict]
    skipped: int
    format: str


def convert_rows(rows: list[dict], fmt: str = "auto") -> Conversion:
    """``rows`` of format ``fmt`` (``auto``: detected) as project rows; bad rows are skipped."""
    if fmt == "auto":
        fmt = detect_format(rows)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use auto or one of {sorted(FORMATS)}")
    converted = [FORMATS[fmt].convert(row) for row in rows]
    good = [row for row in converted if row is not None]
    return Conversion(good, len(rows) - len(good), fmt)


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a .jsonl, .json (an array, or one object a line) or .parquet file; a line that
    is not a JSON object becomes ``{}`` (skipped and counted by the converters)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"input file {str(p)!r} does not exist")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if p.suffix not in (".jsonl", ".json"):
        raise ValueError(f"input file {str(p)!r}: use .jsonl, .json or .parquet")
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json" and text.lstrip().startswith("["):
        return [row if isinstance(row, dict) else {} for row in json.loads(text)]
    rows = []
    for line in text.splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = {}
            rows.append(row if isinstance(row, dict) else {})
    return rows


def _column(values: list):
    """A parquet column; mixed value types (MATH's "Level 5" next to MATH-500's 5) become
    strings."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def write_rows(rows: list[dict], path: str | Path) -> Path:
    """Write ``rows`` as .jsonl or .parquet (columns: every key of any row), making parents."""
    p = Path(path)
    if p.suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"output file {str(p)!r}: use .jsonl or .parquet")
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        keys = list(dict.fromkeys(key for row in rows for key in row))
        pq.write_table(pa.table({key: _column([row.get(key) for row in rows]) for key in keys}), p)
    else:
        with p.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return p


def split_rows(rows: list[dict], eval_fraction: float, seed: int) -> tuple[list, list]:
    """``(train, eval)``: a seeded shuffle, with ``eval_fraction`` of the rows (at least one
    when the fraction is positive, never all) held out."""
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval fraction {eval_fraction} must be in [0, 1)")
    if eval_fraction == 0.0 or len(rows) < 2:
        return list(rows), []
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    held = min(max(round(len(rows) * eval_fraction), 1), len(rows) - 1)
    return shuffled[held:], shuffled[:held]
