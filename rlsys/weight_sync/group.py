"""A standalone process group between learner rank 0 and the engines.

Standalone (its own ``TCPStore`` and backend object, never ``init_process_group``) because an
in-process vLLM engine owns the default group of its process, and learners own theirs.
"""

from __future__ import annotations

import contextlib
import datetime
import pickle
import socket

import torch
import torch.distributed as dist

from rlsys.weight_sync.base import SyncAddress

GLOO_DEVICES = 2  # parallel TCP pairs per peer: 3.3 -> 4.1 GB/s for 64 MiB broadcasts here


def free_address() -> SyncAddress:
    """This node's IP and a free port for rank 0 to host the group's store."""
    import ray

    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return SyncAddress(ray.util.get_node_ip_address(), port)


def _node_key() -> str:
    """Identifies a machine whose processes share /dev/shm (the Ray node when in Ray)."""
    import ray

    if ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    return socket.gethostname()


class SyncGroup:
    """Rank 0 (the sender) plus receivers: gloo for control and CPU data, NCCL for GPU data."""

    def __init__(
        self, rank: int, world_size: int, address: SyncAddress, device: str, timeout_s: float
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self._gathers = 0  # all_gather_object calls so far (each uses fresh store keys)
        self.device = torch.device(device)
        self.store = dist.TCPStore(
            address.host, address.port, world_size, rank == 0, timeout=timeout
        )
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [
            dist.ProcessGroupGloo.create_default_device() for _ in range(GLOO_DEVICES)
        ]
        options._threads = 2 * GLOO_DEVICES
        self.gloo = dist.ProcessGroupGloo(
            dist.PrefixStore("gloo", self.store), rank, world_size, options
        )
        self.nccl = None
        if self.device.type == "cuda":
            self.nccl = dist.ProcessGroupNCCL(
                dist.PrefixStore("nccl", self.store), rank, world_size
            )
        self.nodes = self.all_gather_object(_node_key())

    def broadcast(self, tensor: torch.Tensor) -> dist.Work:
        """Start broadcasting ``tensor`` from rank 0 (in place on receivers)."""
        group = self.nccl if tensor.is_cuda else self.gloo
        return group.broadcast([tensor], dist.BroadcastOptions())

    def broadcast_object(self, obj=None):
        """Rank 0's ``obj`` on every rank (small control messages)."""
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self.gloo.broadcast([size], dist.BroadcastOptions()).wait()
        if self.rank != 0:
            payload = torch.empty(int(size), dtype=torch.uint8)
        self.gloo.broadcast([payload], dist.BroadcastOptions()).wait()
        return obj if self.rank == 0 else pickle.loads(payload.numpy().tobytes())

    def all_gather_object(self, obj) -> list:
        """Every rank's ``obj``, in rank order (through the store: setup-time only)."""
        self._gathers += 1
        key = f"gather{self._gathers}"
        self.store.set(f"{key}/{self.rank}", pickle.dumps(obj))
        return [pickle.loads(self.store.get(f"{key}/{r}")) for r in range(self.world_size)]

    @property
    def same_node(self) -> bool:
        """Whether every member runs on rank 0's node."""
        return all(node == self.nodes[0] for node in self.nodes)

    def barrier(self) -> dist.Work:
        """Start a barrier on the control group."""
        return self.gloo.barrier()

    def close(self) -> None:
        for group in (self.nccl, self.gloo):
            if group is not None and hasattr(group, "shutdown"):
                with contextlib.suppress(Exception):  # best effort at teardown
                    group.shutdown()
