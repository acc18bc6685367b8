"""An engine's weights put away while the learners train (colocated placement), and back.

On a GPU the weights move to host memory, as vLLM's level-1 sleep does for its engine. On a
CPU there is no other memory to move them to: their bytes go to a scratch file and their pages
go back to the OS, so the learners sharing the machine get them. The file is unlinked as soon
as it is created and used through its descriptor, so a process killed while asleep leaves
nothing behind; it holds raw bytes this process wrote (shapes and dtypes stay in memory), so
nothing read back can run. The parameters stay the same ``nn.Parameter`` objects throughout
(tied weights stay tied; only their storage goes and comes back).
"""

from __future__ import annotations

import os
import tempfile

import torch

from rlsys.runtime import release_free_memory

ALIGN = 64  # bytes: every parameter starts on a cache line, as allocators place tensors


class ParkedWeights:
    """Parks a module's parameters off its device (``park``) and brings them back
    (``restore``). Buffers stay where they are: they are small (rotary tables)."""

    def __init__(self, module: torch.nn.Module, device: torch.device) -> None:
        self.module = module
        self.device = device
        self.parked = False
        self._shapes: dict[str, torch.Size] = {}  # what each parameter held before parking
        self._host: dict[str, torch.Tensor] = {}  # GPU: the host copies
        self._fd: int | None = None  # CPU: the unlinked scratch file

    def park(self) -> int:
        """Free the parameters' storage on the device; returns the bytes freed."""
        if self.parked:
            return 0
        params = dict(self.module.named_parameters())  # tied weights once
        self._shapes = {name: p.shape for name, p in params.items()}
        nbytes = sum(p.numel() * p.element_size() for p in params.values())
        if self.device.type == "cpu":
            self._fd = _scratch_file()
            offsets, _ = _layout(params, self._shapes)
            for name, p in params.items():
                _write_all(self._fd, _bytes_of(p.detach()), offsets[name])
        else:
            self._host = {name: p.detach().to("cpu") for name, p in params.items()}
        for p in params.values():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        release_free_memory()
        self.parked = True
        return nbytes

    def restore(self) -> None:
        """Bring the parked parameters back onto the device."""
        if not self.parked:
            return
        params = dict(self.module.named_parameters())
        if self.device.type == "cpu":
            offsets, end = _layout(params, self._shapes)
            # One block for all of them: an allocation this large is a memory mapping of its
            # own, which the C library unmaps when it is freed, so the next sleep gives every
            # byte back (separate tensors may share heap pages with other live objects).
            block = torch.empty(end, dtype=torch.uint8)
            _read_all(self._fd, block.numpy(), 0)
            for name, p in params.items():
                size = self._shapes[name].numel() * p.element_size()
                raw = block[offsets[name] : offsets[name] + size]
                p.data = raw.view(p.dtype).view(self._shapes[name])
            self.discard()
        else:
            for name, p in params.items():
                p.data = self._host[name].to(self.device)
            self._host = {}
        self.parked = False

    def discard(self) -> None:
        """Close the scratch file (its disk space goes with the descriptor)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _layout(
    params: dict[str, torch.nn.Parameter], shapes: dict[str, torch.Size]
) -> tuple[dict[str, int], int]:
    """Each parameter's byte offset in the parked block, and the block's size."""
    offsets, end = {}, 0
    for name, p in params.items():
        offsets[name] = end
        end += -(-shapes[name].numel() * p.element_size() // ALIGN) * ALIGN
    return offsets, end


def _scratch_file() -> int:
    """A read-write descriptor of a new file that has no name any more."""
    handle, path = tempfile.mkstemp(prefix="rlsys-parked-")
    os.unlink(path)
    return handle


def _bytes_of(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes, without a copy (numpy has no bfloat16: go through uint8)."""
    return memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())


def _write_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _read_all(fd: int, into, offset: int) -> None:
    view = memoryview(into)
    while view:
        got = os.preadv(fd, [view], offset)
        if not got:
            raise OSError(f"parked weights: the scratch file ended {len(view)} bytes early")
        view, offset = view[got:], offset + got
