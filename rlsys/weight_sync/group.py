"""A standalone process group between learner rank 0 and the engines.

Standalone (its own ``TCPStore`` and backend object, never ``init_process_group``) because an
in-process vLLM engine owns the default group of its process, and learners own theirs.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import os
import secrets
import socket
import sys

import torch
import torch.distributed as dist

from rlsys.weight_sync import wire
from rlsys.weight_sync.base import SyncAddress

HEADER_BYTES = 16384  # control-message frame: a bucket header of a few hundred tensors fits
GLOO_DEVICES = 2  # parallel TCP pairs per peer: 3.3 -> 4.1 GB/s for 64 MiB broadcasts here


def free_address() -> SyncAddress:
    """This node's IP, a free port for rank 0 to host the group's store, and a fresh token
    the members prove they hold (``SyncGroup``)."""
    import ray

    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return SyncAddress(ray.util.get_node_ip_address(), port, secrets.token_hex(16))


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on ``host`` only (TCPStore would listen on every interface)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def _proof(token: str, nonce: str, rank: int) -> str:
    return hmac.new(token.encode(), f"{nonce}:{rank}".encode(), hashlib.sha256).hexdigest()


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
        self._listener = _listening_socket(address.host, address.port) if rank == 0 else None
        self.store = dist.TCPStore(
            address.host,
            address.port,
            world_size,
            rank == 0,
            timeout=timeout,
            master_listen_fd=self._listener.fileno() if self._listener is not None else None,
        )
        if address.token:
            self._authenticate(address.token)
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

    def _authenticate(self, token: str) -> None:
        """Every member proves it holds the run's token before anything else is exchanged:
        rank 0 posts a nonce, each rank answers with an HMAC of it, rank 0 checks them all
        and lets the group go on. A process that reached the store's port without the token
        makes the group fail here, naming the rank it took."""
        if self.rank == 0:
            nonce = secrets.token_hex(16)
            self.store.set("auth/nonce", nonce)
            for rank in range(1, self.world_size):
                proof = self.store.get(f"auth/{rank}").decode(errors="replace")
                if not hmac.compare_digest(proof, _proof(token, nonce, rank)):
                    self.store.set("auth/verdict", "refused")
                    raise PermissionError(
                        f"a process without this run's token joined the weight-sync group as "
                        f"rank {rank} (at the store's port, from outside the run); the sync "
                        "group is not formed. Keep the cluster's ports unreachable from other "
                        "users, or restart the run"
                    )
            self.store.set("auth/verdict", "ok")
        else:
            nonce = self.store.get("auth/nonce").decode()
            self.store.set(f"auth/{self.rank}", _proof(token, nonce, self.rank))
            if self.store.get("auth/verdict") != b"ok":
                raise PermissionError(
                    "learner rank 0 refused the weight-sync group (a member without the run's "
                    "token joined)"
                )

    def broadcast(self, tensor: torch.Tensor) -> dist.Work:
        """Start broadcasting ``tensor`` from rank 0 (in place on receivers)."""
        group = self.nccl if tensor.is_cuda else self.gloo
        return group.broadcast([tensor], dist.BroadcastOptions())

    def broadcast_object(self, obj=None):
        """Rank 0's ``obj`` on every rank (small control messages, ``wire``'s fixed format):
        one broadcast of a fixed-size frame (8-byte length + message), a second only for what
        does not fit."""
        frame = torch.zeros(HEADER_BYTES, dtype=torch.uint8)
        if self.rank == 0:
            data = wire.encode(obj)
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
        return obj if self.rank == 0 else wire.decode(data)

    def all_gather_object(self, obj) -> list:
        """Every rank's ``obj``, in rank order (through the store: setup-time only)."""
        self._gathers += 1
        key = f"gather{self._gathers}"
        self.store.set(f"{key}/{self.rank}", wire.encode(obj))
        return [wire.decode(self.store.get(f"{key}/{r}")) for r in range(self.world_size)]

    @property
    def same_node(self) -> bool:
        """Whether every member runs on rank 0's node."""
        return all(node == self.nodes[0] for node in self.nodes)

    def close(self) -> None:
        for group in (self.nccl, self.gloo):
            if group is not None and hasattr(group, "shutdown"):
                with contextlib.suppress(Exception):  # best effort at teardown
                    group.shutdown()
        if self._listener is not None:
            self._listener.close()
