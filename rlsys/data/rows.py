"""Dataset rows from a .jsonl, .json (lines or one array), .parquet, .csv or .arrow file, or a
Hugging Face ``datasets`` directory (``save_to_disk``): what file tasks and preference pairs
read.

A row is a plain dict (JSON values only, so it can ride in checkpoints); a malformed jsonl
line becomes ``{}`` for the caller to count, and a path that cannot be read is a
``ConfigError`` naming the config key that gave it.
"""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.data.images import BINARY_URL

log = logging.getLogger(__name__)


def read_rows(path: str, key: str = "task.train_path") -> list[dict]:
    """The rows of a .jsonl or .parquet file (``key``: the config key that named it). A jsonl
    line that is not UTF-8, not JSON or not a JSON object becomes ``{}``, for the caller to
    count as malformed; the reasons are logged with their first line numbers. A path that is
    missing, not a file, of another format or without a single row is a ConfigError."""
    p = Path(path).expanduser()
    if p.is_dir() and any((p / name).is_file() for name in DATASETS_MARKERS):
        rows = _datasets_rows(p, key)
    elif not p.is_file():
        what = "is a directory" if p.is_dir() else "does not exist"
        raise ConfigError(
            f"{key}={path!r} {what}; pass a .jsonl, .json, .parquet, .csv or .arrow file or a "
            "Hugging Face datasets directory (Dataset.save_to_disk)"
        )
    elif p.suffix == ".arrow":
        rows = _datasets_rows(p, key)
    elif p.suffix in (".parquet", ".csv"):
        rows = _table_rows(p, path, key)
    elif p.suffix == ".json" and _starts_with(p, b"["):
        rows = _json_array_rows(p, key)
    elif p.suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(p, key)
    else:
        raise ConfigError(
            f"{key}={path!r}: use a .jsonl, .json (lines or one array), .parquet, .csv or "
            ".arrow file, or a Hugging Face datasets directory"
        )
    if not rows:
        raise ConfigError(f"{key}={path!r} holds no rows; pass a file with one row per prompt")
    return rows


def _table_rows(p: Path, path: str, key: str) -> list[dict]:
    """The rows of the .parquet or .csv file ``p`` (``path`` as the config gave it), read by
    pyarrow."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    read, kind = (pq.read_table, "parquet") if p.suffix == ".parquet" else (pcsv.read_csv, "CSV")
    try:
        return [_plain(row) for row in read(p).to_pylist()]
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{key}={path!r} is not a readable {kind} file: {exc}") from exc


# files that make a directory one written by the `datasets` library's save_to_disk
DATASETS_MARKERS = ("state.json", "dataset_dict.json")


def _datasets_rows(path: Path, key: str) -> list[dict]:
    """The rows of a ``save_to_disk`` directory or an .arrow file, read by the ``datasets``
    library (a DatasetDict gives its ``train`` split; point the key at another split's
    folder for that one)."""
    try:
        import datasets
    except ImportError as exc:
        raise ConfigError(
            f"{key}={str(path)!r} needs the `datasets` library: pip install datasets"
        ) from exc
    try:
        if path.is_file():
            data = datasets.Dataset.from_file(str(path))
        else:
            data = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001 - any failure to read is the file's
        raise ConfigError(f"{key}={str(path)!r} is not a readable dataset: {exc}") from exc
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise ConfigError(
                f"{key}={str(path)!r} holds the splits {sorted(data)} and no 'train'; point "
                f"{key} at one of them, e.g. {str(path / sorted(data)[0])!r}"
            )
        log.info("%s=%s: the 'train' split of %s", key, path, sorted(data))
        data = data["train"]
    return [_plain(row) for row in data.to_list()]


# A .json file holding one array is parsed whole; past this size, it is refused (as JSON lines
# it would stream)
MAX_JSON_ARRAY_BYTES = 2 << 30


def _starts_with(path: Path, prefix: bytes) -> bool:
    """Whether the file's first non-blank bytes are ``prefix`` (a JSON array's ``[``)."""
    with path.open("rb") as fh:
        head = fh.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")
    return head.startswith(prefix)


def _json_array_rows(path: Path, key: str) -> list[dict]:
    """The objects of a JSON array file; an element that is not an object becomes ``{}``
    (counted as malformed by the caller)."""
    size = path.stat().st_size
    if size > MAX_JSON_ARRAY_BYTES:
        raise ConfigError(
            f"{key}={str(path)!r} is one JSON array of {size / 2**30:.1f} GiB; write it as JSON "
            "lines (one object per line, .jsonl), which is read as it streams"
        )
    try:
        with path.open("rb") as fh:
            values = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{key}={str(path)!r} is not a readable JSON array: {exc}") from exc
    bad = sum(not isinstance(v, dict) for v in values)
    if bad:
        log.warning("%s=%s: skipped %d array elements that are not JSON objects", key, path, bad)
    return [v if isinstance(v, dict) else {} for v in values]


def _plain(value):
    """A parquet value as JSON would hold it (dates, decimals and bytes as strings; bytes that
    are not UTF-8, such as an image column's, as a base64 data URL that load_image reads), so
    a row's extra columns can ride in checkpoints (rlsys.checkpoint.state_file holds plain values only)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return BINARY_URL + base64.b64encode(value).decode("ascii")
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


# A jsonl line longer than this is skipped as it streams past, never held whole: no prompt row
# needs more (an image inlined as a data URL included), and a 10 MB line had cost seconds and
# gigabytes before it was dropped as too long anyway
MAX_LINE_BYTES = 8 << 20


def _lines(fh, limit: int = MAX_LINE_BYTES):
    """The lines of binary file ``fh``; a line over ``limit`` bytes comes as None, read past in
    1 MiB pieces."""
    while True:
        raw = fh.readline(limit + 1)
        if not raw:
            return
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield raw
            continue
        while raw and not raw.endswith(b"\n"):  # the rest of the long line
            raw = fh.readline(1 << 20)
        yield None


def _jsonl_rows(path: Path, key: str) -> list[dict]:
    rows: list[dict] = []
    bad: dict[str, list[int]] = {}  # reason -> line numbers
    with path.open("rb") as fh:
        for number, raw in enumerate(_lines(fh), start=1):
            if raw is None:
                bad.setdefault(f"over {MAX_LINE_BYTES >> 20} MiB", []).append(number)
                rows.append({})  # counted as malformed by the caller
                continue
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                row = json.loads(line)
                reason = None if isinstance(row, dict) else "not a JSON object"
            except UnicodeDecodeError:
                reason = "not UTF-8"
            except json.JSONDecodeError:
                reason = "not JSON"
            if reason is None:
                rows.append(row)
            else:
                bad.setdefault(reason, []).append(number)
                rows.append({})  # counted as malformed by the caller
    if bad:
        log.warning(
            "%s=%s: skipped %s",
            key,
            path,
            "; ".join(
                f"{len(lines)} lines {reason} (lines {', '.join(map(str, lines[:5]))}"
                f"{', ...' if len(lines) > 5 else ''})"
                for reason, lines in bad.items()
            ),
        )
    return rows
