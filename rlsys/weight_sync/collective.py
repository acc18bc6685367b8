"""Streaming transports over a standalone group: ``collective`` and ``cuda_ipc``.

Per bucket, learner rank 0 packs the (already gathered) tensors into a slot of its data plane,
broadcasts a small header (tensor names, dtypes, shapes, offsets) over gloo and posts the bytes;
each engine reads the bytes, loads the bucket and releases the slot. Because posting is
asynchronous, the learner gathers and packs bucket k+1 while bucket k is on its way, and never
holds more than two packed buckets. A ``None`` header ends the sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from rlsys.config.schema import WeightSyncConfig
from rlsys.weight_sync.base import (
    Bucket,
    SendResult,
    SyncAddress,
    WeightUpdate,
    bucket_bytes,
    layout,
    pack,
    unpack,
)
from rlsys.weight_sync.group import SyncGroup
from rlsys.weight_sync.planes import (
    BroadcastPlane,
    CudaIpcPlane,
    ResidentPlane,
    SharedMemoryPlane,
)

# the dtypes an engine may ask to keep its weights in (a member's announcement is checked
# against these before the plane packs in it)
VIEW_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CollectiveTransport:
    """Learner rank 0 -> every engine through a process group (gloo/shm on CPU, NCCL on GPU)."""

    def __init__(self, cfg: WeightSyncConfig | None = None) -> None:
        self.cfg = cfg or WeightSyncConfig(transport="collective")
        self.group: SyncGroup | None = None
        self.plane: BroadcastPlane | None = None

    def connect(
        self,
        rank: int,
        world_size: int,
        address: SyncAddress,
        device: str,
        resident_dtype: str | None = None,
    ) -> None:
        self.group = SyncGroup(rank, world_size, address, device, self.cfg.timeout_s)
        members = self.group.all_gather_object((torch.device(device).type, resident_dtype))
        self.plane = self._plane([d for d, _ in members], {r for _, r in members[1:]})

    def _plane(self, devices: list[str], resident: set[str | None]) -> BroadcastPlane:
        group, mode = self.group, self.cfg.cpu_data_plane
        if all(d == "cuda" for d in devices):
            return BroadcastPlane(group, torch.device("cuda", torch.cuda.current_device()))
        if mode == "shm" and not group.same_node:
            raise ValueError(
                "weight_sync.cpu_data_plane=shm needs every engine on learner rank 0's node; "
                "set weight_sync.cpu_data_plane=auto (or gloo)"
            )
        if mode in ("auto", "shm") and group.same_node:
            (dtype,) = resident if len(resident) == 1 else (None,)
            if self.cfg.zero_copy and dtype in VIEW_DTYPES:  # every engine keeps views of one
                return ResidentPlane(group, torch.device("cpu"), VIEW_DTYPES[dtype])
            return SharedMemoryPlane(group, torch.device("cpu"))
        return BroadcastPlane(group, torch.device("cpu"))

    @property
    def resident(self) -> bool:
        return isinstance(self.plane, ResidentPlane)

    @property
    def data_plane(self) -> str:
        """Which plane carries the bytes: shm, shm_resident (zero-copy), gloo, nccl or
        cuda_ipc."""
        if isinstance(self.plane, CudaIpcPlane):
            return "cuda_ipc"
        if isinstance(self.plane, ResidentPlane):
            return "shm_resident"
        if isinstance(self.plane, SharedMemoryPlane):
            return "shm"
        return "nccl" if self.plane.device.type == "cuda" else "gloo"

    def send(self, buckets: Iterable[Bucket], version: int) -> SendResult:
        group, plane = self._connected()
        result = SendResult(version, data_plane=self.data_plane)
        for bucket in buckets:  # each next() gathers the following bucket from the shards
            if not bucket:
                continue
            slices, nbytes = layout(bucket, plane.dtype)
            slot = plane.slot(result.num_buckets)
            buffer = plane.acquire(slot, nbytes)
            pack(bucket, slices, buffer)  # the one copy on the sender (device-aware)
            group.broadcast_object(
                {
                    "version": version,
                    "slot": slot,
                    "nbytes": nbytes,
                    "slices": slices,
                    "plane": plane.describe(slot),
                }
            )
            plane.post(slot, buffer)
            result.num_buckets += 1
            result.num_tensors += len(slices)
            result.num_bytes += bucket_bytes(bucket)
        group.broadcast_object(None)
        plane.drain()
        return result

    def receive(self, update: WeightUpdate) -> Iterator[Bucket]:
        group, plane = self._connected()
        while (header := group.broadcast_object()) is not None:
            if header["version"] != update.version:
                raise RuntimeError(
                    f"weight sync out of step: this engine expected version {update.version} "
                    f"but learner rank 0 is sending version {header['version']}"
                )
            buffer = plane.receive(header["slot"], header["nbytes"], header["plane"])
            yield unpack(header["slices"], buffer)
            plane.release(header["slot"])
        plane.finish()

    def _connected(self) -> tuple[SyncGroup, BroadcastPlane]:
        if self.group is None:
            raise RuntimeError("weight transport used before connect(); start pools first")
        return self.group, self.plane

    def close(self) -> None:
        if self.plane is not None:
            self.plane.close()
        if self.group is not None:
            self.group.close()
        self.group = self.plane = None


class CudaIpcTransport(CollectiveTransport):
    """Engines colocated on learner rank 0's GPU read its bucket buffers by CUDA IPC."""

    def _plane(self, devices: list[str], resident: set[str | None]) -> BroadcastPlane:
        if any(d != "cuda" for d in devices) or not self.group.same_node:
            raise ValueError(
                "weight_sync.transport=cuda_ipc needs the learner and every engine on one GPU "
                f"node (devices here: {devices}); use weight_sync.transport=collective or "
                "object_store"
            )
        return CudaIpcPlane(self.group, torch.device("cuda", torch.cuda.current_device()))
