"""Data planes of the streaming transports: how one packed bucket's bytes reach the engines.

Every plane double-buffers: the sender packs bucket k+1 into one slot while bucket k, in the
other slot, is still travelling or being loaded, so the sender holds at most two buckets.

* ``BroadcastPlane``: the bytes are broadcast over the group (gloo on CPU, NCCL on GPU).
* ``SharedMemoryPlane``: all members share a node; slots are files in /dev/shm mapped by every
  member, so bytes are written once and loaded straight from the mapping; gloo only signals.
* ``ResidentPlane``: shared memory again, but a slot per bucket and two versions alternating,
  so engines keep their weights as views of the slot files: a load is the sender's one copy.
* ``CudaIpcPlane``: engines on the learner's GPU map its slot buffers by CUDA IPC handle.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any

import torch

from rlsys.weight_sync.group import SyncGroup

SLOTS = 2
ACK_POLL_S = 20e-6  # sender's sleep between looks at the release counters


class BroadcastPlane:
    """Bucket bytes broadcast from rank 0; the receiver owns a buffer per slot."""

    dtype: torch.dtype | None = None  # floating tensors are packed in this dtype; None: as sent

    def __init__(self, group: SyncGroup, device: torch.device) -> None:
        self.group, self.device = group, device
        self.buffers: list[torch.Tensor | None] = [None] * SLOTS
        self.works: list[Any] = [None] * SLOTS

    def _buffer(self, slot: int, nbytes: int) -> torch.Tensor:
        buf = self.buffers[slot]
        if buf is None or buf.numel() < nbytes:
            buf = self.buffers[slot] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return buf[:nbytes]

    def acquire(self, slot: int, nbytes: int) -> torch.Tensor:
        """Sender: a slot buffer to pack into, once its previous send has finished."""
        self.wait(slot)
        return self._buffer(slot, nbytes)

    def slot(self, index: int) -> int:
        """Sender: the slot bucket ``index`` of this sync goes into."""
        return index % SLOTS

    def describe(self, slot: int) -> dict:
        return {}

    def post(self, slot: int, buffer: torch.Tensor) -> None:
        """Sender: start sending the packed slot."""
        self.works[slot] = self.group.broadcast(buffer)

    def receive(self, slot: int, nbytes: int, description: dict) -> torch.Tensor:
        """Receiver: the bucket's bytes, once they have arrived."""
        buffer = self._buffer(slot, nbytes)
        self.group.broadcast(buffer).wait()
        return buffer

    def release(self, slot: int) -> None:
        """Receiver: done with the slot's bytes."""

    def wait(self, slot: int) -> None:
        if self.works[slot] is not None:
            self.works[slot].wait()
            self.works[slot] = None

    def drain(self) -> None:
        """Sender: return once every receiver is done with this sync."""
        for slot in range(SLOTS):
            self.wait(slot)

    def finish(self) -> None:
        """Receiver: every bucket of this sync has been loaded."""

    def close(self) -> None:
        self.buffers = [None] * SLOTS


SLOT_PREFIX = "/dev/shm/rlsys-weights-"


def _slot_path(path) -> str:
    """A slot or control file a header names: only rlsys's own files in /dev/shm are mapped
    (a receiver maps and may extend what it is told)."""
    if not isinstance(path, str) or not path.startswith(SLOT_PREFIX) or "/" in path[9:]:
        raise ValueError(f"weight-sync header names {path!r}, not a slot file of rlsys's")
    return path


class SharedMemoryPlane(BroadcastPlane):
    """Slots are /dev/shm files every member maps. Receivers acknowledge a slot by bumping their
    counter in a shared control array, which the sender reads before refilling that slot: no
    message per bucket beyond the header (a gloo barrier per bucket cost ~5 ms here)."""

    def __init__(self, group: SyncGroup, device: torch.device) -> None:
        super().__init__(group, device)
        self.prefix = f"{SLOT_PREFIX}{uuid.uuid4().hex[:12]}"
        self.paths: list[str | None] = [None] * SLOTS
        self.generation = 0
        self.posted = [0] * SLOTS  # sender: buckets put in each slot so far
        self.released = [0] * SLOTS  # receiver: buckets taken from each slot so far
        self.ctl_path: str | None = None
        self.ctl: torch.Tensor | None = None  # (world_size, SLOTS) int64 release counters
        if group.rank == 0:
            self.ctl_path = f"{self.prefix}-ctl"
            self.ctl = self._map_ctl(self.ctl_path)
            self.ctl.zero_()

    def _map(self, path: str, nbytes: int) -> torch.Tensor:
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
        return torch.tensor([], dtype=torch.uint8).set_(storage)

    def _map_ctl(self, path: str) -> torch.Tensor:
        shape = (self.group.world_size, SLOTS)
        return self._map(path, 8 * shape[0] * shape[1]).view(torch.int64).view(shape)

    def acquire(self, slot: int, nbytes: int) -> torch.Tensor:
        self.wait(slot)  # every receiver has loaded what this slot held
        buf = self.buffers[slot]
        if buf is None or buf.numel() < nbytes:
            self._unlink(slot)
            self.generation += 1
            self.paths[slot] = f"{self.prefix}-{slot}-{self.generation}"
            buf = self.buffers[slot] = self._map(self.paths[slot], nbytes)
        return buf[:nbytes]

    def describe(self, slot: int) -> dict:
        return {"path": self.paths[slot], "size": self.buffers[slot].numel(), "ctl": self.ctl_path}

    def post(self, slot: int, buffer: torch.Tensor) -> None:
        self.posted[slot] += 1

    def wait(self, slot: int) -> None:
        """Sender: block until every receiver has released this slot's last bucket."""
        if self.group.rank != 0 or not self.posted[slot]:
            return
        deadline = time.monotonic() + self.group.timeout_s
        while bool((self.ctl[1:, slot] < self.posted[slot]).any()):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"engines did not release weight bucket slot {slot} within "
                    f"weight_sync.timeout_s={self.group.timeout_s:g}s"
                )
            time.sleep(ACK_POLL_S)

    def _attach(self, description: dict) -> None:
        """Receiver: map the sender's release counters (once)."""
        if self.ctl is None:
            self.ctl_path = _slot_path(description["ctl"])
            self.ctl = self._map_ctl(self.ctl_path)

    def receive(self, slot: int, nbytes: int, description: dict) -> torch.Tensor:
        self._attach(description)
        if self.paths[slot] != description["path"]:
            self.paths[slot] = _slot_path(description["path"])
            self.buffers[slot] = self._map(description["path"], description["size"])
        return self.buffers[slot][:nbytes]

    def release(self, slot: int) -> None:
        # The loads from the slot are done (the loader returned) before this store is issued.
        self.released[slot] += 1
        self.ctl[self.group.rank, slot] = self.released[slot]

    def _unlink(self, slot: int) -> None:
        if self.group.rank == 0 and self.paths[slot] is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.paths[slot])

    def close(self) -> None:
        for slot in range(SLOTS):
            self._unlink(slot)
        if self.group.rank == 0 and self.ctl_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.ctl_path)
        super().close()


def _check_room(path: str, nbytes: int) -> None:
    stat = os.statvfs(os.path.dirname(path))
    free = stat.f_bavail * stat.f_frsize
    if free < nbytes:
        raise RuntimeError(
            f"weight_sync.zero_copy needs {nbytes / 2**20:.0f} MiB more in /dev/shm for the "
            f"engines' weights but {free / 2**20:.0f} MiB are free (it holds two versions of "
            "the model in the engines' dtype); enlarge /dev/shm (docker run --shm-size, a "
            "Kubernetes emptyDir with medium: Memory) or set weight_sync.zero_copy=false"
        )


class ResidentPlane(SharedMemoryPlane):
    """Zero-copy loads (``weight_sync.zero_copy``): the engines' weights live in the slots.

    Sync ``s`` packs its bucket ``i`` into slot ``2 * i + s % 2``, a /dev/shm file of its own
    that every member maps; the sender casts into the engines' dtype as it packs (its one
    copy), and each engine points its parameters at the views instead of copying out of
    them, so the engines on a node share those pages and a load costs the engine nothing.
    An engine leaves the slots of sync ``s`` only when it adopts sync ``s + 1``, so the
    sender may refill them (sync ``s + 2``) once every engine has adopted the sync between:
    ``drain`` waits for that at the end of every send, and receivers count adopted syncs in
    the shared control array (column 0)."""

    def __init__(self, group: SyncGroup, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(group, device)
        self.dtype = dtype  # what floating tensors are packed as: the engines' dtype
        self.files: dict[int, tuple[str, torch.Tensor]] = {}  # slot -> (path, mapping)
        self.syncs = 0  # sender: syncs sent; receiver: syncs adopted

    def slot(self, index: int) -> int:
        return 2 * index + self.syncs % 2

    def acquire(self, slot: int, nbytes: int) -> torch.Tensor:
        path, buf = self.files.get(slot, (None, None))
        if buf is None or buf.numel() < nbytes:
            self._unlink(slot)  # the engines left this parity when they adopted the last sync
            self.generation += 1
            path = f"{self.prefix}-{slot}-{self.generation}"
            _check_room(path, nbytes)
            self.files[slot] = (path, self._map(path, nbytes))
        return self.files[slot][1][:nbytes]

    def describe(self, slot: int) -> dict:
        path, buf = self.files[slot]
        return {"path": path, "size": buf.numel(), "ctl": self.ctl_path}

    def post(self, slot: int, buffer: torch.Tensor) -> None:
        """Nothing to signal: receivers read the bytes once the header has reached them."""

    def wait(self, slot: int) -> None:
        """Nothing to wait for: the last ``drain`` freed this parity's slots."""

    def drain(self) -> None:
        self.syncs += 1
        if self.group.rank != 0:
            return
        deadline = time.monotonic() + self.group.timeout_s
        while bool((self.ctl[1:, 0] < self.syncs).any()):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"engines did not adopt weight sync {self.syncs} within "
                    f"weight_sync.timeout_s={self.group.timeout_s:g}s"
                )
            time.sleep(ACK_POLL_S)

    def receive(self, slot: int, nbytes: int, description: dict) -> torch.Tensor:
        self._attach(description)
        path = _slot_path(description["path"])
        if self.files.get(slot, (None,))[0] != path:
            self.files[slot] = (path, self._map(path, description["size"]))
        return self.files[slot][1][:nbytes]

    def release(self, slot: int) -> None:
        """The engine keeps the views until the next sync: ``finish`` signals instead."""

    def finish(self) -> None:
        self.syncs += 1
        self.ctl[self.group.rank, 0] = self.syncs

    def _unlink(self, slot: int) -> None:
        path = self.files.pop(slot, (None,))[0]
        if self.group.rank == 0 and path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self) -> None:
        for slot in list(self.files):
            self._unlink(slot)
        self.files = {}
        super().close()


class CudaIpcPlane(SharedMemoryPlane):
    """Slots are CUDA buffers of the learner's GPU; engines on that GPU open their IPC handles."""

    def __init__(self, group: SyncGroup, device: torch.device) -> None:
        super().__init__(group, device)
        self.handles: list[Any] = [None] * SLOTS

    def acquire(self, slot: int, nbytes: int) -> torch.Tensor:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

        self.wait(slot)
        buf = self.buffers[slot]
        if buf is None or buf.numel() < nbytes:
            self.generation += 1
            buf = self.buffers[slot] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self.paths[slot] = f"{self.prefix}-{slot}-{self.generation}"
            rebuild, args = reduce_tensor(buf)
            if rebuild is not rebuild_cuda_tensor:
                raise RuntimeError(f"a CUDA buffer reduced to {rebuild!r}, not a CUDA IPC handle")
            self.handles[slot] = args  # the handle's fields; receivers rebuild with the same
        return buf[:nbytes]

    def describe(self, slot: int) -> dict:
        return {
            "path": self.paths[slot],
            "ipc": self.handles[slot],
            "gpu": gpu_uuid(self.device),
            "ctl": self.ctl_path,  # receivers release slots through the same counters
        }

    def post(self, slot: int, buffer: torch.Tensor) -> None:
        torch.cuda.current_stream(self.device).synchronize()  # packed bytes visible to others
        super().post(slot, buffer)

    def release(self, slot: int) -> None:
        torch.cuda.current_stream(self.device).synchronize()  # our copies out have finished
        super().release(slot)

    def receive(self, slot: int, nbytes: int, description: dict) -> torch.Tensor:
        self._attach(description)
        if self.paths[slot] != description["path"]:
            if description["gpu"] != gpu_uuid(self.device):
                raise RuntimeError(
                    "weight_sync.transport=cuda_ipc needs every engine on its learner's GPU, "
                    f"but this engine runs on GPU {gpu_uuid(self.device)} and the learner on "
                    f"{description['gpu']}; use placement=colocated or "
                    "weight_sync.transport=collective"
                )
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            self.paths[slot] = description["path"]
            # the handle's fields (wire.py's fixed format); the rebuild is always CUDA IPC's
            self.buffers[slot] = rebuild_cuda_tensor(*description["ipc"])
        return self.buffers[slot][:nbytes]

    def _unlink(self, slot: int) -> None:
        """CUDA buffers are freed with their tensors."""


def gpu_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)
