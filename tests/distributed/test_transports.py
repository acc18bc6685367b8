"""The streaming transport in real processes: bit-exact buckets, bucket boundaries, versions.

One sender and two receivers form a real sync group (TCPStore + gloo) in spawned processes, for
both CPU data planes (and, on a GPU machine, CUDA IPC with all three on one GPU, and NCCL from
one GPU to another). Tensors of mixed dtypes (fp32, bf16, int64, a 0-d scalar) travel in
buckets under a byte limit; receivers must see exactly the sender's buckets, bit for bit, over
several versions with different values each time.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from rlsys.config.schema import WeightSyncConfig
from rlsys.weight_sync import TRANSPORTS
from rlsys.weight_sync.base import SyncAddress, WeightUpdate, bucket_bytes, bucketize

LIMIT = 4096  # bytes per bucket
TOKEN = "this-runs-secret"  # what every member of a sync group proves it holds


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _state(version: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(version)
    return {
        "embed.weight": torch.randn(32, 16, generator=gen),  # 2048 B
        "layer.0.w": torch.randn(16, 16, generator=gen).to(torch.bfloat16),  # 512 B
        "layer.0.b": torch.randn(7, generator=gen),  # odd size: alignment
        "layer.1.w": torch.randn(40, 40, generator=gen),  # 6400 B: over the limit, alone
        "steps": torch.tensor(version, dtype=torch.int64),  # 0-d
        "layer.2.w": torch.randn(16, 8, generator=gen).to(torch.bfloat16),
    }


def _buckets(state: dict[str, torch.Tensor]):
    return bucketize(state.items(), LIMIT)


# plane -> transport on GPUs; the CPU planes are the collective transport's
GPU_PLANES = {"cuda_ipc": "cuda_ipc", "nccl": "collective"}


def _member(rank, world, port, plane, versions, out):
    name = GPU_PLANES.get(plane, "collective")
    device = "cuda" if plane in GPU_PLANES else "cpu"
    if plane == "cuda_ipc":
        torch.cuda.set_device(0)  # every member on one GPU, as colocated actors are
    elif plane == "nccl":
        torch.cuda.set_device(rank)  # NCCL refuses two ranks on one GPU
    transport = TRANSPORTS.get(name)(
        WeightSyncConfig(
            transport=name, cpu_data_plane="auto" if device == "cuda" else plane, timeout_s=60
        )
    )
    transport.connect(rank, world, SyncAddress("127.0.0.1", port, TOKEN), device)
    # control messages larger than one frame take a second broadcast
    big = transport.group.broadcast_object(list(range(20000)) if rank == 0 else None)
    seen = [big == list(range(20000))]
    for version in range(1, versions + 1):
        if rank == 0:
            state = {k: v.to(device) for k, v in _state(version).items()}
            sent = transport.send(_buckets(state), version)
            seen.append((sent.num_buckets, sent.num_tensors, sent.num_bytes))
        else:
            # copy out: a yielded bucket is only valid until the next one is requested
            got = [
                {k: v.cpu().clone() for k, v in b.items()}
                for b in transport.receive(WeightUpdate(version))
            ]
            seen.append(got)
    out[rank] = (transport.data_plane, seen)
    transport.close()


GPUS = torch.cuda.device_count()


@pytest.mark.parametrize(
    ("plane", "world"),
    [
        pytest.param("shm", 3, id="shm"),
        pytest.param("gloo", 3, id="gloo"),
        pytest.param("cuda_ipc", 3, id="cuda_ipc", marks=pytest.mark.gpu),
        pytest.param(  # a sender and one receiver, each on its own GPU
            "nccl",
            2,
            id="nccl",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    0 < GPUS < 2, reason=f"the NCCL plane needs 2 CUDA GPUs; this has {GPUS}"
                ),
            ],
        ),
    ],
)
def test_receivers_get_the_senders_buckets_bit_for_bit(plane, world, monkeypatch):
    versions = 3
    if plane == "gloo":  # the gloo plane also binds where GLOO_SOCKET_IFNAME says
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    out = mp.Manager().dict()
    mp.spawn(_member, args=(world, _port(), plane, versions, out), nprocs=world)
    for rank in range(world):
        assert out[rank][0] == plane
    assert all(out[rank][1][0] for rank in range(world))  # the large control message
    sender = out[0][1][1:]
    for version in range(1, versions + 1):
        expected = list(_buckets(_state(version)))
        assert sender[version - 1] == (
            len(expected),
            6,
            sum(bucket_bytes(b) for b in expected),
        )
        for rank in range(1, world):
            got = out[rank][1][version]
            assert [list(b) for b in got] == [list(b) for b in expected]  # same boundaries
            for got_bucket, want_bucket in zip(got, expected, strict=True):
                assert bucket_bytes(got_bucket) <= LIMIT or len(got_bucket) == 1
                for name, want in want_bucket.items():
                    assert got_bucket[name].dtype == want.dtype
                    assert torch.equal(got_bucket[name], want), (plane, version, name)


def _resident_member(rank, world, port, versions, out):
    """Receivers keep each sync's tensors as they are (no copy), as an HF engine does."""
    transport = TRANSPORTS.get("collective")(
        WeightSyncConfig(transport="collective", cpu_data_plane="shm", timeout_s=60)
    )
    views = "float32" if rank else None
    transport.connect(rank, world, SyncAddress("127.0.0.1", port, TOKEN), "cpu", views)
    seen, kept = [], None
    for version in range(1, versions + 1):
        if rank == 0:
            transport.send(_buckets(_state(version)), version)
            continue
        got = {}
        for bucket in transport.receive(WeightUpdate(version)):
            got.update(bucket)
            if kept is not None:  # the last sync's views, while this one is being written
                seen.append(("held", version - 1, _intact(kept, version - 1)))
        seen.append(
            ("got", version, _intact(got, version), {k: str(v.dtype) for k, v in got.items()})
        )
        kept = got
    out[rank] = (transport.data_plane, transport.resident, seen)
    transport.close()


def _intact(tensors: dict[str, torch.Tensor], version: int) -> bool:
    want = _state(version)
    return all(torch.equal(t, want[k].to(t.dtype)) for k, t in tensors.items()) and len(
        tensors
    ) == len(want)


def test_zero_copy_plane_keeps_each_sync_intact_until_the_next_is_adopted():
    """``weight_sync.zero_copy``: floating tensors arrive in the engines' dtype, integers as
    they are, and the views an engine keeps of sync v stay unchanged while sync v + 1 is
    written (two versions alternate); syncs 1..4 reuse each parity's files twice."""
    out = mp.Manager().dict()
    world, versions = 3, 4
    mp.spawn(_resident_member, args=(world, _port(), versions, out), nprocs=world)
    assert out[0][:2] == ("shm_resident", True)
    for rank in range(1, world):
        plane, resident, seen = out[rank]
        assert (plane, resident) == ("shm_resident", True)
        got = [entry for entry in seen if entry[0] == "got"]
        assert [(v, ok) for _, v, ok, _ in got] == [(v, True) for v in range(1, versions + 1)]
        dtypes = got[0][3]
        assert dtypes["layer.0.w"] == "torch.float32"  # bf16 at the sender, cast on packing
        assert dtypes["steps"] == "torch.int64"
        held = [entry for entry in seen if entry[0] == "held"]
        assert len(held) >= versions - 1 and all(ok for _, _, ok in held)


def test_a_missing_gloo_interface_is_named_with_the_fix(monkeypatch):
    from rlsys.weight_sync.group import _gloo_devices

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuchif0")
    with pytest.raises(RuntimeError, match=r"GLOO_SOCKET_IFNAME='nosuchif0'.*ip addr"):
        _gloo_devices(2)


class _Exploit:
    """Unpickling this runs code: what a peer could send while the group spoke pickle."""

    def __reduce__(self):
        return (open, ("/tmp/rlsys-weight-sync-pwned", "w"))


def _sender(port, out):
    """Rank 0 of a two-member group, with the run's token."""
    from rlsys.weight_sync.group import SyncGroup

    try:
        SyncGroup(0, 2, SyncAddress("127.0.0.1", port, TOKEN), "cpu", timeout_s=30)
        out["sender"] = "formed"
    except PermissionError as exc:
        out["sender"] = f"refused: {exc}"


def _intruder(port, out):
    """A process that reached the store's port without the token: joins as rank 1, answers
    the nonce with a guess and offers a pickle that runs code when loaded."""
    import datetime
    import pickle

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=30))
    store.get("auth/nonce")
    store.set("auth/1", "a guess")
    store.set("gather1/1", pickle.dumps(_Exploit()))
    out["intruder"] = store.get("auth/verdict").decode()


def test_a_process_without_the_token_cannot_join_or_run_code_in_the_sender(tmp_path):
    """The sync group's store listens where it is told (loopback here), a member must prove
    it holds the run's token, and messages are wire.py's fixed format: a foreign process that
    joined as rank 1 made rank 0 unpickle (and run) what it sent, before."""
    import os

    import psutil

    from rlsys.weight_sync import wire

    pwned = "/tmp/rlsys-weight-sync-pwned"
    if os.path.exists(pwned):
        os.unlink(pwned)
    port = _port()
    out = mp.Manager().dict()
    ctx = mp.get_context("spawn")
    sender = ctx.Process(target=_sender, args=(port, out))
    sender.start()
    listening = []
    for _ in range(100):  # the store's socket, once rank 0 made it
        listening = [
            c.laddr.ip
            for c in psutil.net_connections("tcp")
            if c.status == "LISTEN" and c.laddr.port == port
        ]
        if listening:
            break
        sender.join(0.1)
    intruder = ctx.Process(target=_intruder, args=(port, out))
    intruder.start()
    sender.join(60)
    intruder.join(60)
    assert listening == ["127.0.0.1"]  # not every interface
    assert out["sender"].startswith("refused: a process without this run's token joined")
    assert "as rank 1" in out["sender"] and out["intruder"] == "refused"
    assert not os.path.exists(pwned)
    import pickle

    with pytest.raises(wire.WireError, match="not JSON"):
        wire.decode(pickle.dumps(_Exploit()))
    assert not os.path.exists(pwned)


def test_control_messages_round_trip_in_the_fixed_format():
    """Headers, shared-memory descriptions and a CUDA IPC handle's fields (as reduce_tensor
    gives them on a GPU) encode and decode exactly; other types are refused."""
    from rlsys.weight_sync import wire
    from rlsys.weight_sync.base import layout

    slices, nbytes = layout(_state(1))
    header = {"version": 3, "slot": 1, "nbytes": nbytes, "slices": slices}
    header["plane"] = {"path": "/dev/shm/rlsys-weights-ab-1-1", "size": 4096, "ctl": None}
    assert wire.decode(wire.encode(header)) == header
    ipc = (  # reduce_tensor's CUDA fields: classes, sizes, dtype, device, handles, flags
        torch.Tensor,
        torch.Size([4096]),
        (1,),
        0,
        torch.storage.TypedStorage,
        torch.uint8,
        0,
        b"\x01\x02handle",
        4096,
        0,
        False,
        b"refcounter",
        8,
        b"event",
        True,
    )
    assert wire.decode(wire.encode({"ipc": ipc})) == {"ipc": ipc}
    with pytest.raises(wire.WireError, match="cannot travel"):
        wire.encode({"f": open})
    with pytest.raises(wire.WireError, match="unknown tag"):
        wire.decode(b'{"__reduce__": ["os.system", ["true"]]}')
    with pytest.raises(wire.WireError, match="__class__"):
        wire.decode(b'{"__class__": "Popen"}')
