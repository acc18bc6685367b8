"""Weight transports from learners to rollout engines (``weight_sync.transport``).

``TRANSPORTS`` maps each name to a builder ``(WeightSyncConfig) -> WeightTransport`` that
imports its transport module only when called (they import torch and Ray), so the config can
validate names cheaply. The shared types live in ``rlsys.weight_sync.base``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlsys.registry import Registry

if TYPE_CHECKING:
    from rlsys.config.schema import WeightSyncConfig
    from rlsys.weight_sync.base import WeightTransport

TRANSPORTS: Registry[Callable[..., WeightTransport]] = Registry(
    "weight transport", "weight_sync.transport"
)


@TRANSPORTS.register("object_store")
def _object_store(cfg: WeightSyncConfig) -> WeightTransport:
    from rlsys.weight_sync.object_store import ObjectStoreTransport

    return ObjectStoreTransport(cfg)


@TRANSPORTS.register("collective")
def _collective(cfg: WeightSyncConfig) -> WeightTransport:
    from rlsys.weight_sync.collective import CollectiveTransport

    return CollectiveTransport(cfg)


@TRANSPORTS.register("cuda_ipc", colocated_gpus=True)  # shares GPU memory in place
def _cuda_ipc(cfg: WeightSyncConfig) -> WeightTransport:
    from rlsys.weight_sync.collective import CudaIpcTransport

    return CudaIpcTransport(cfg)
