"""The weight-transport seam: learner rank 0 sends buckets, engines receive them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

Bucket = dict[str, torch.Tensor]  # parameter name -> full (unsharded) tensor


@dataclass
class WeightUpdate:
    """What the controller hands to every engine: a versioned, transport-specific handle."""

    version: int  # policy version these weights are
    buckets: list[Any]  # transport-specific bucket handles, in order
    num_tensors: int = 0
    num_bytes: int = 0
    meta: dict = field(default_factory=dict)


class WeightTransport(Protocol):
    """Moves full-tensor buckets from learner rank 0 to rollout engines."""

    def send(self, buckets: Iterable[Bucket], version: int) -> WeightUpdate:
        """Publish buckets (on learner rank 0); returns the handle engines receive from."""

    def receive(self, update: WeightUpdate) -> Iterator[Bucket]:
        """Yield the buckets of ``update`` one at a time (on an engine)."""
