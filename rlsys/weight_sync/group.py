"""A standalone process group between learner rank 0 and the engines.

Standalone (its own ``TCPStore`` and backend object, never ``init_process_group``) because an
in-process vLLM engine owns the default group of its process, and learners own theirs.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import socket
import sys

import torch
import torch.distributed as dist

from rlsys.weight_sync.base import SyncAddress

HEADER_BYTES = 16384  # control-message frame: a bucket header of a few hundred tensors fits
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
    ray = sys.modules.get("ray")  # not imported: no Ray here, and none need be installed
    if ray is not None and ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    return socket.gethostname()


def _gloo_devices(count: int) -> list:
    """``count`` gloo endpoints on an address the other members can reach.

    Gloo's default endpoint is whatever this machine's hostname resolves to, which on many
    hosts (``127.0.1.1`` in /etc/hosts) is loopback: fine on one machine, unreachable from
    another. So: the interfaces in ``GLOO_SOCKET_IFNAME`` when set (as ``init_process_group``
    honours it), else the IP Ray advertises for this node (other nodes reach it there), else
    the hostname's address.
    """
    gloo = dist.ProcessGroupGloo
    setting = os.environ.get("GLOO_SOCKET_IFNAME", "")
    interfaces = [name for name in setting.split(",") if name]
    if interfaces:
        try:
            return [
                gloo.create_device(interface=interfaces[i % len(interfaces)]) for i in range(count)
            ]
        except RuntimeError as exc:
            raise RuntimeError(
                f"GLOO_SOCKET_IFNAME={setting!r} names an interface this machine "
                f"({socket.gethostname()}) lacks or that has no address ({exc}); set it to the "
                "interfaces that reach the other nodes (`ip addr` lists them) or unset it"
            ) from exc
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ip = ray.util.get_node_ip_address()
        return [gloo.create_device(hostname=ip) for _ in range(count)]
    return [gloo.create_default_device() for _ in range(count)]


class SyncGroup:
    """Rank 0 (the sender) plus receivers: gloo for control and CPU data, NCCL for GPU data."""

    def __init__(
        self, rank: int, world_size: int, address: SyncAddress, device: str, timeout_s: float
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank, self.world_size = rank, world_size
        self.timeout_s = timeout_s
        self._gathers = 0  # all_gather_object calls so far (each uses fresh store keys)
        self.device = torch.device(device)
        self.store = dist.TCPStore(
            address.host, address.port, world_size, rank == 0, timeout=timeout
        )
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = _gloo_devices(GLOO_DEVICES)
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
        """Rank 0's ``obj`` on every rank (small control messages): one broadcast of a
        fixed-size frame (8-byte length + pickle), a second only for what does not fit."""
        frame = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
        if self.rank == 0:
            data = pickle.dumps(obj)
            frame[:8] = torch.frombuffer(
                bytearray(len(data).to_bytes(8, "little")), dtype=torch.uint8
            )
            head = data[: HEADER_BYTES - 8]
            if head:
                frame[8 : 8 + len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
        self.gloo.broadcast([frame], dist.BroadcastOptions()).wait()
        size = int.from_bytes(frame[:8].numpy().tobytes(), "little")
        if size > HEADER_BYTES - 8:
            rest = torch.empty(size - (HEADER_BYTES - 8), dtype=torch.uint8)
            if self.rank == 0:
                rest.copy_(torch.frombuffer(bytearray(data[HEADER_BYTES - 8 :]), dtype=torch.uint8))
            self.gloo.broadcast([rest], dist.BroadcastOptions()).wait()
            if self.rank != 0:
                data = frame[8:].numpy().tobytes() + rest.numpy().tobytes()
        elif self.rank != 0:
            data = frame[8 : 8 + size].numpy().tobytes()
        return obj if self.rank == 0 else pickle.loads(data)

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

    def close(self) -> None:
        for group in (self.nccl, self.gloo):
            if group is not None and hasattr(group, "shutdown"):
                with contextlib.suppress(Exception):  # best effort at teardown
                    group.shutdown()
