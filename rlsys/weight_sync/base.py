"""The weight-transport seam: learner rank 0 sends buckets, engines receive them.

A sync is one call on each side, running concurrently: ``send(buckets, version)`` on learner
rank 0 and ``receive(update)`` on every engine. Transports that stream (collective, cuda_ipc)
hand each bucket over while the next one is being gathered; the object store publishes every
bucket first and engines read them once ``update.published`` (the send's result) resolves.
Before the first sync every member calls ``connect``: rank 0 is learner rank 0, ranks 1.. are the
engines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

Bucket = dict[str, torch.Tensor]  # parameter name -> full (unsharded) tensor


@dataclass
class SendResult:
    """What learner rank 0 reports after sending one version."""

    version: int
    num_buckets: int = 0
    num_tensors: int = 0
    num_bytes: int = 0
    data_plane: str = ""  # what carried the bytes: object_store, shm, gloo, nccl or cuda_ipc
    handle: Any = None  # transport-specific, for receivers (object store: the bucket refs)


@dataclass
class WeightUpdate:
    """What every engine is handed for one sync."""

    version: int  # policy version these weights are
    published: Any = None  # a Ray ref to the sender's SendResult (nested, so not auto-resolved)


@dataclass(frozen=True)
class SyncAddress:
    """Where rank 0 of the sync group hosts its rendezvous, and the run's secret a member
    proves it holds to join (it travels to the members through Ray, never the store)."""

    host: str
    port: int
    token: str = ""  # empty: no proof asked (tests that form a group by hand)


class WeightTransport(Protocol):
    """Moves full-tensor buckets from learner rank 0 to rollout engines."""

    def connect(
        self,
        rank: int,
        world_size: int,
        address: SyncAddress,
        device: str,
        resident_dtype: str | None = None,
    ) -> None:
        """Join the sync group (collective: every member, at once). ``resident_dtype``: an
        engine that can keep the weights it receives as views (``resident`` below) says in
        which dtype it holds them."""

    @property
    def resident(self) -> bool:
        """Whether yielded buckets stay valid until the next sync, so an engine may keep
        their tensors as its weights instead of copying them (``weight_sync.zero_copy``)."""

    def send(self, buckets: Iterable[Bucket], version: int) -> SendResult:
        """Send every bucket (on learner rank 0)."""

    def receive(self, update: WeightUpdate) -> Iterator[Bucket]:
        """Yield the buckets of ``update`` one at a time (on an engine); a yielded bucket is only
        valid until the next one is requested, so consumers copy out of it, unless the
        transport is ``resident``."""

    def close(self) -> None:
        """Leave the group and free buffers."""


# ---- flat buffers: one bucket as contiguous bytes plus a small description ------------------


@dataclass(frozen=True)
class TensorSlice:
    """Where one tensor of a bucket lives in its flat byte buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int  # bytes; aligned to ``ALIGN``


ALIGN = 64  # byte alignment of every tensor inside a flat buffer


def bucket_bytes(bucket: Bucket) -> int:
    """Bytes the tensors of ``bucket`` hold."""
    return sum(t.numel() * t.element_size() for t in bucket.values())


def bucketize(named: Iterable[tuple[str, torch.Tensor]], limit: int) -> Iterator[Bucket]:
    """Group named tensors, in order, into buckets of at most ``limit`` bytes; a single tensor
    larger than ``limit`` gets a bucket of its own."""
    bucket: Bucket = {}
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > limit:
            yield bucket
            bucket, size = {}, 0
        bucket[name] = tensor
        size += nbytes
    if bucket:
        yield bucket


def layout(bucket: Bucket, cast: torch.dtype | None = None) -> tuple[list[TensorSlice], int]:
    """Offsets of each tensor of ``bucket`` in a flat buffer, and the buffer's size;
    ``cast``: floating tensors are packed in this dtype (``pack`` converts as it copies)."""
    slices, offset = [], 0
    for name, tensor in bucket.items():
        dtype = cast if cast is not None and tensor.is_floating_point() else tensor.dtype
        slices.append(
            TensorSlice(name, str(dtype).removeprefix("torch."), tuple(tensor.shape), offset)
        )
        offset += math.ceil(tensor.numel() * dtype.itemsize / ALIGN) * ALIGN
    return slices, offset


def pack(bucket: Bucket, slices: list[TensorSlice], buffer: torch.Tensor) -> None:
    """Copy ``bucket`` into the uint8 ``buffer`` at the offsets in ``slices``."""
    for item in slices:
        dest = unpack_one(item, buffer)
        dest.copy_(bucket[item.name].detach().reshape(item.shape))


def unpack_one(item: TensorSlice, buffer: torch.Tensor) -> torch.Tensor:
    """The tensor ``item`` as a view into the uint8 ``buffer`` (no copy)."""
    dtype = getattr(torch, item.dtype)
    nbytes = math.prod(item.shape) * dtype.itemsize
    return buffer[item.offset : item.offset + nbytes].view(dtype).view(item.shape)


def unpack(slices: list[TensorSlice], buffer: torch.Tensor) -> Bucket:
    """Every tensor of a packed bucket, as views into ``buffer``."""
    return {item.name: unpack_one(item, buffer) for item in slices}


def digests(named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> dict:
    """{name: SHA-256 of the tensor's bytes} (cast to ``dtype`` first where given): two
    sides of a weight sync compare these to prove the copy bit for bit."""
    import hashlib

    out = {}
    for name, tensor in named:
        t = tensor.detach()
        if dtype is not None:
            t = t.to(dtype)
        raw = t.cpu().contiguous().reshape(-1).view(torch.uint8)
        out[name] = hashlib.sha256(raw.numpy().tobytes()).hexdigest()
    return out
