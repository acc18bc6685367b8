"""A KV cache whose layers grow in place, for rlsys's own decode loop (``shrinking.py``).

transformers' ``DynamicLayer`` appends each decode step's key and value with ``torch.cat``, so
every step copies the layer's whole cache (rows x heads x length x head size, keys and values):
the copying grows with the square of the reply length. In a profile of one fp32 SmolLM2
generation on this project's 2-core Xeon (``scripts/bench_decode.py --profile``) ``aten::cat``
took 14% of the CPU time. Here a layer keeps its keys and values in buffers with room for
``CHUNK`` more tokens (never more than the call can reach): a step writes its token into the
next free column and the layer's ``keys``/``values`` are views of the filled columns; a full
buffer is copied into a larger one once per ``CHUNK`` steps. Dropping rows
(``batch_select_indices``, as the loop sheds ended rows) copies the kept rows once, as the
dynamic layer does.

Attention reads the same numbers in the same order, so decoding is unchanged bit for bit
(tests/unit/test_kv_cache.py). Only plain full-attention layers are replaced; sliding-window
and other layer kinds stay transformers' own.
"""

from __future__ import annotations

from functools import partial

import torch
from transformers.cache_utils import Cache, DynamicLayer

CHUNK = 64  # columns a full buffer grows by: one copy of the cache per CHUNK decode steps


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes new tokens into preallocated room instead of
    concatenating; ``limit``: the most tokens the layer will hold (prompt + budget), so no
    buffer reserves more."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self._room: tuple[torch.Tensor, torch.Tensor] | None = None  # (keys, values) buffers

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        filled = self.get_seq_length()
        end = filled + key_states.shape[-2]
        if not self._fits(end, key_states, value_states):
            self._reserve(filled, end, key_states, value_states)
        keys, values = self._room
        keys[..., filled:end, :].copy_(key_states)
        values[..., filled:end, :].copy_(value_states)
        self.keys, self.values = keys[..., :end, :], values[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``: one copy of them, their room with them."""
        if self.get_seq_length() == 0 or not self._views_room():
            super().batch_select_indices(indices)  # keys no longer ours: transformers' way
            return
        filled = self.get_seq_length()
        keys, values = (t.index_select(0, indices) for t in self._room)
        self._room = (keys, values)
        self.keys, self.values = keys[..., :filled, :], values[..., :filled, :]

    def offload(self) -> None:
        """Move the filled columns to the CPU and let the device buffers go; the next
        ``update`` reserves new room and copies them back in."""
        super().offload()
        self._room = None

    def reset(self) -> None:
        super().reset()
        self._room = None

    def _views_room(self) -> bool:
        """Whether ``keys`` are still the leading columns of the buffer (another of the
        dynamic layer's methods, ``reorder_cache`` say, may have replaced them)."""
        return self._room is not None and self.keys.data_ptr() == self._room[0].data_ptr()

    def _fits(self, end: int, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        if self._room is None or (self.get_seq_length() and not self._views_room()):
            return False
        keys, values = self._room
        return (
            keys.shape[-2] >= end
            and keys.shape[:-2] == key_states.shape[:-2]
            and keys.shape[-1] == key_states.shape[-1]
            and values.shape[-1] == value_states.shape[-1]
            and keys.dtype == key_states.dtype
        )

    def _reserve(
        self, filled: int, end: int, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> None:
        """New buffers for ``end`` tokens and up to ``CHUNK`` more (within ``limit`` while the
        call keeps to it), the ``filled`` columns copied in."""
        room = end + CHUNK if end > self.limit else min(self.limit, end + CHUNK)
        keys = key_states.new_empty((*key_states.shape[:-2], room, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:-2], room, value_states.shape[-1]))
        if filled:
            keys[..., :filled, :].copy_(self.keys)
            values[..., :filled, :].copy_(self.values)
        self._room = (keys, values)


def grow_in_place(cache: Cache, limit: int) -> Cache:
    """``cache`` (transformers' dynamic cache, empty or holding prompts) with each plain
    full-attention layer replaced by a ``GrowingLayer`` holding the same keys and values;
    ``limit``: the most tokens a layer will hold."""
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            grown = GrowingLayer(limit)
            if layer.get_seq_length():
                grown.update(layer.keys, layer.values)
            cache.layers[i] = grown
    if cache.layer_class_to_replicate is DynamicLayer:  # a cache made without a config
        cache.layer_class_to_replicate = partial(GrowingLayer, limit)
    return cache
