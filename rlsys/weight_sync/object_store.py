"""Weight transport through Ray's object store: one numpy dict per bucket, zero-copy reads.

numpy arrays (not torch tensors) go into the store because Ray reads them back zero-copy from
shared memory; bfloat16 has no numpy dtype, so it travels as its int16 bit pattern.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import ray
import torch

from rlsys.weight_sync.base import Bucket, WeightUpdate

_BITCAST = {torch.bfloat16: torch.int16}


def encode(bucket: Bucket) -> dict[str, tuple[np.ndarray, str]]:
    """Tensors -> (numpy array, torch dtype name) pairs."""
    out = {}
    for name, tensor in bucket.items():
        carrier = _BITCAST.get(tensor.dtype)
        array = (tensor.view(carrier) if carrier else tensor).contiguous().numpy()
        out[name] = (array, str(tensor.dtype).removeprefix("torch."))
    return out


def decode(payload: dict[str, tuple[np.ndarray, str]]) -> Bucket:
    """The inverse of ``encode``; tensors share memory with the (read-only) arrays."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only arrays: we only copy from them
        for name, (array, dtype) in payload.items():
            tensor = torch.from_numpy(array)
            target = getattr(torch, dtype)
            out[name] = tensor.view(target) if tensor.dtype != target else tensor
    return out


class ObjectStoreTransport:
    """``send`` puts each bucket in the object store; ``receive`` gets them one by one."""

    def send(self, buckets: Iterable[Bucket], version: int) -> WeightUpdate:
        refs, tensors, nbytes = [], 0, 0
        for bucket in buckets:
            if not bucket:
                continue
            refs.append(ray.put(encode(bucket)))
            tensors += len(bucket)
            nbytes += sum(t.numel() * t.element_size() for t in bucket.values())
        return WeightUpdate(version=version, buckets=refs, num_tensors=tensors, num_bytes=nbytes)

    def receive(self, update: WeightUpdate) -> Iterator[Bucket]:
        for ref in update.buckets:
            yield decode(ray.get(ref))
