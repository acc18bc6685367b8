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

from rlsys.config.schema import WeightSyncConfig
from rlsys.weight_sync.base import Bucket, SendResult, SyncAddress, WeightUpdate, bucket_bytes

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
    """``send`` puts each bucket in the object store; ``receive`` gets them one by one.

    Works across nodes with no group to set up. The store holds the whole model until every
    engine has read it (unlike the streaming transports, which hold about two buckets).
    """

    def __init__(self, cfg: WeightSyncConfig | None = None) -> None:
        self.cfg = cfg

    def connect(
        self,
        rank: int,
        world_size: int,
        address: SyncAddress,
        device: str,
        resident_dtype: str | None = None,
    ) -> None:
        """Nothing to join: Ray's object store is the medium."""

    @property
    def resident(self) -> bool:
        """The store's objects are read once and freed: engines copy out of them."""
        return False

    def send(self, buckets: Iterable[Bucket], version: int) -> SendResult:
        result = SendResult(version, data_plane="object_store", handle=[])
        for bucket in buckets:
            if not bucket:
                continue
            result.handle.append(ray.put(encode({k: t.cpu() for k, t in bucket.items()})))
            result.num_buckets += 1
            result.num_tensors += len(bucket)
            result.num_bytes += bucket_bytes(bucket)
        return result

    def receive(self, update: WeightUpdate) -> Iterator[Bucket]:
        sent: SendResult = ray.get(update.published)
        for ref in sent.handle:
            yield decode(ray.get(ref))

    def close(self) -> None:
        """Nothing held."""
