"""The weight-sync group's control messages in a fixed format: JSON with a few tagged types,
never pickle.

Bucket headers (tensor names, dtypes, shapes, offsets), data-plane descriptions (shared-memory
paths, a CUDA IPC handle's fields) and setup values are all that travels, so a closed set of
types covers them: JSON's own, tuples, bytes, ``torch.dtype``, ``TensorSlice`` and the
classes a CUDA IPC handle names (``torch.Tensor`` and its storage types). A peer that is
not a member of the run (anyone who reaches the store's port) can at worst send a message that
fails to decode; with pickle, a third process that joined as a receiver ran code in the sender.
"""

from __future__ import annotations

import base64
import json

import torch

from rlsys.weight_sync.base import TensorSlice

# classes a message may name, by name (a CUDA IPC handle's tensor and storage types)
CLASSES = {
    "Tensor": torch.Tensor,
    "TypedStorage": torch.storage.TypedStorage,
    "UntypedStorage": torch.UntypedStorage,
}
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}
MAX_DEPTH = 32  # nesting of a message (headers are 4 deep)


class WireError(ValueError):
    """A control message that is not one the sync group sends."""


def encode(obj) -> bytes:
    """``obj`` as UTF-8 JSON with tagged non-JSON values (raises WireError on other types)."""
    return json.dumps(_tagged(obj, 0), separators=(",", ":")).encode()


def decode(data: bytes):
    """The value ``encode`` wrote (raises WireError on anything else)."""
    try:
        raw = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"weight-sync message is not JSON ({exc})") from exc
    return _untagged(raw, 0)


def _tagged(obj, depth: int):
    if depth > MAX_DEPTH:
        raise WireError("weight-sync message nested too deep")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, TensorSlice):
        return {"__slice__": [obj.name, obj.dtype, list(obj.shape), obj.offset]}
    if isinstance(obj, torch.dtype):
        return {"__dtype__": str(obj).removeprefix("torch.")}
    if isinstance(obj, (bytes, bytearray)):
        return {"__bytes__": base64.b64encode(bytes(obj)).decode("ascii")}
    if isinstance(obj, type):
        name = next((n for n, c in CLASSES.items() if c is obj), None)
        if name is None:
            raise WireError(f"class {obj!r} cannot travel in a weight-sync message")
        return {"__class__": name}
    if isinstance(obj, (tuple, torch.Size)):
        return {"__tuple__": [_tagged(x, depth + 1) for x in obj]}
    if isinstance(obj, list):
        return [_tagged(x, depth + 1) for x in obj]
    if isinstance(obj, dict) and all(isinstance(k, str) and not k.startswith("__") for k in obj):
        return {k: _tagged(v, depth + 1) for k, v in obj.items()}
    raise WireError(f"{type(obj).__name__} cannot travel in a weight-sync message")


def _untagged(raw, depth: int):
    if depth > MAX_DEPTH:
        raise WireError("weight-sync message nested too deep")
    if raw is None or isinstance(raw, (bool, int, float, str)):
        return raw
    if isinstance(raw, list):
        return [_untagged(x, depth + 1) for x in raw]
    if not isinstance(raw, dict):
        raise WireError(f"unexpected {type(raw).__name__} in a weight-sync message")
    tags = [k for k in raw if k.startswith("__")]
    if not tags:
        return {k: _untagged(v, depth + 1) for k, v in raw.items()}
    if len(raw) != 1:
        raise WireError(f"malformed tagged value {sorted(raw)[:3]} in a weight-sync message")
    tag, value = tags[0], raw[tags[0]]
    try:
        if tag == "__tuple__":
            return tuple(_untagged(x, depth + 1) for x in value)
        if tag == "__bytes__":
            return base64.b64decode(value, validate=True)
        if tag == "__dtype__":
            return DTYPES[value]
        if tag == "__class__":
            return CLASSES[value]
        if tag == "__slice__":
            name, dtype, shape, offset = value
            if dtype not in DTYPES or not all(isinstance(n, int) for n in [*shape, offset]):
                raise WireError(f"bad tensor slice {value!r}")
            return TensorSlice(str(name), dtype, tuple(shape), offset)
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"bad {tag} value in a weight-sync message ({exc})") from exc
    raise WireError(f"unknown tag {tag} in a weight-sync message")
