"""The controller's checkpoint state in a format that cannot run code when read: JSON for
the structure, an ``.npz`` (read with ``allow_pickle=False``) for its numpy arrays.

A checkpoint directory is something people download and share, so nothing in it may be read
with pickle. The state is a tree of None, bool, int, float, str, list, tuple, dict, numpy
arrays and the dataclasses of ``rlsys.types`` (the buffer's queued groups) and the shapes
task's ``ShapeScene`` (a prompt's picture, described); anything else is
refused when saving, naming where in the tree it was. Tagged JSON objects carry what JSON has
no type for::

    {"__tuple__": [...]}                          a tuple
    {"__dict__": [[key, value], ...]}             a dict whose keys are not all strings
    {"__array__": "a3"}                           array a3 of the .npz
    {"__dataclass__": "Sample", "fields": {...}}  one of rlsys.types' dataclasses

On reading, a tag names only those types: a class outside ``rlsys.types``' list, an array of
objects or an unknown tag is an error, never an import; so is nesting deeper than
``MAX_DEPTH`` (a run's state is about 20 levels deep; a file nested thousands deep would
otherwise exhaust Python's recursion).
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from rlsys.data.shapes import ShapeScene
from rlsys.types import (
    Completion,
    Episode,
    Prompt,
    PromptPixels,
    RolloutGroup,
    Sample,
    SamplingParams,
    Turn,
)

FORMAT = "rlsys.trainer_state"
VERSION = 1
_CLASSES = {
    cls.__name__: cls
    for cls in (
        Prompt,
        PromptPixels,  # a VL prompt's processed images
        ShapeScene,  # a shapes prompt's picture, described (rlsys.data.shapes)
        SamplingParams,
        Episode,
        Turn,
        Completion,
        Sample,
        RolloutGroup,
    )
}
_TAGS = ("__tuple__", "__dict__", "__array__", "__dataclass__")
_ARRAY_KINDS = "biufc"  # bool, integers, floats, complex: nothing that holds objects
MAX_DEPTH = 100  # lists, tuples, dicts, dataclasses and arrays a state may nest


class StateFileError(ValueError):
    """A state that cannot be written, or a file that is not a valid state."""


def write_state(json_path: Path, state: Any) -> None:
    """Write ``state`` to ``json_path`` and its arrays to ``json_path`` with suffix .npz
    (only when it has arrays)."""
    arrays: dict[str, np.ndarray] = {}
    tree = _encode(state, arrays, "state", MAX_DEPTH)
    document = {"format": FORMAT, "version": VERSION, "arrays": sorted(arrays), "state": tree}
    json_path.write_text(json.dumps(document, separators=(",", ":")))
    if arrays:
        with json_path.with_suffix(".npz").open("wb") as fh:
            np.savez(fh, **arrays)


def read_state(json_path: Path) -> Any:
    """The state ``write_state`` wrote; StateFileError names the file and what is wrong."""
    try:
        document = json.loads(json_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StateFileError(f"{json_path} is unreadable: {exc}") from exc
    except RecursionError:  # json's parser recurses per level: no traceback for a planted file
        raise StateFileError(
            f"{json_path} is nested deeper than {MAX_DEPTH} levels: not a state rlsys wrote"
        ) from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise StateFileError(f"{json_path} is not an rlsys trainer state (no format={FORMAT!r})")
    if document.get("version") != VERSION:
        raise StateFileError(
            f"{json_path} has format version {document.get('version')!r}; this rlsys reads "
            f"version {VERSION}: resume with the rlsys that wrote it"
        )
    arrays: dict[str, np.ndarray] = {}
    if document.get("arrays"):
        npz = json_path.with_suffix(".npz")
        try:
            data = np.load(npz, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):
                raise ValueError("not an .npz archive")
            with data:
                arrays = {name: data[name] for name in document["arrays"]}
        except (OSError, KeyError, ValueError, TypeError, EOFError, zipfile.BadZipFile) as exc:
            raise StateFileError(f"{npz} is unreadable: {exc}") from exc
    try:
        return _decode(document.get("state"), arrays, MAX_DEPTH)
    except _TooDeep:
        raise StateFileError(
            f"{json_path} is nested deeper than {MAX_DEPTH} levels: not a state rlsys wrote"
        ) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{json_path} holds a malformed state: {exc}") from exc


def _encode(obj: Any, arrays: dict[str, np.ndarray], where: str, depth: int) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if depth == 0:  # refused when saving, not only when resuming
        raise StateFileError(f"{where} nests deeper than {MAX_DEPTH} levels")
    depth -= 1
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _ARRAY_KINDS:
            raise StateFileError(f"{where}: an array of {obj.dtype} cannot be checkpointed")
        name = f"a{len(arrays)}"
        arrays[name] = obj
        return {"__array__": name}
    if isinstance(obj, (list, tuple)):
        items = [_encode(v, arrays, f"{where}[{i}]", depth) for i, v in enumerate(obj)]
        return items if isinstance(obj, list) else {"__tuple__": items}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and k not in _TAGS for k in obj):
            return {k: _encode(v, arrays, f"{where}[{k!r}]", depth) for k, v in obj.items()}
        return {
            "__dict__": [
                [
                    _encode(k, arrays, f"{where} key", depth),
                    _encode(v, arrays, f"{where}[{k!r}]", depth),
                ]
                for k, v in obj.items()
            ]
        }
    name = type(obj).__name__
    if dataclasses.is_dataclass(obj) and _CLASSES.get(name) is type(obj):
        fields = {
            f.name: _encode(getattr(obj, f.name), arrays, f"{where}.{f.name}", depth)
            for f in dataclasses.fields(obj)
        }
        return {"__dataclass__": name, "fields": fields}
    raise StateFileError(
        f"{where} is a {type(obj).__module__}.{name}, which the trainer state cannot hold; "
        "checkpoint plain values, numpy arrays or rlsys.types dataclasses"
    )


class _TooDeep(ValueError):
    """The state nests deeper than MAX_DEPTH."""


def _decode(obj: Any, arrays: dict[str, np.ndarray], depth: int) -> Any:
    if not isinstance(obj, (list, dict)):
        return obj
    if depth == 0:
        raise _TooDeep
    depth -= 1
    if isinstance(obj, list):
        return [_decode(v, arrays, depth) for v in obj]
    tags = [tag for tag in _TAGS if tag in obj]
    if not tags:
        return {k: _decode(v, arrays, depth) for k, v in obj.items()}
    tag = tags[0]
    if tag == "__tuple__":
        return tuple(_decode(v, arrays, depth) for v in obj[tag])
    if tag == "__dict__":
        return {_decode(k, arrays, depth): _decode(v, arrays, depth) for k, v in obj[tag]}
    if tag == "__array__":
        array = arrays[obj[tag]]
        if array.dtype.kind not in _ARRAY_KINDS:
            raise ValueError(f"array {obj[tag]} has dtype {array.dtype}")
        return array
    cls = _CLASSES.get(obj[tag])
    if cls is None:
        raise ValueError(f"{obj[tag]!r} is not a class a trainer state may hold")
    names = {f.name for f in dataclasses.fields(cls)}
    fields = obj["fields"]
    if not isinstance(fields, dict) or not set(fields) <= names:
        raise ValueError(
            f"{obj[tag]} has fields {sorted(fields)}, expected some of {sorted(names)}"
        )
    return cls(**{k: _decode(v, arrays, depth) for k, v in fields.items()})
