"""Weight transports from learners to rollout engines (``weight_sync.transport``)."""

from rlsys.registry import Registry
from rlsys.weight_sync.base import Bucket, SendResult, SyncAddress, WeightTransport, WeightUpdate
from rlsys.weight_sync.collective import CollectiveTransport, CudaIpcTransport
from rlsys.weight_sync.object_store import ObjectStoreTransport

TRANSPORTS: Registry = Registry("weight transport", "weight_sync.transport")
TRANSPORTS.register("object_store")(ObjectStoreTransport)
TRANSPORTS.register("collective")(CollectiveTransport)
TRANSPORTS.register("cuda_ipc")(CudaIpcTransport)

__all__ = [
    "TRANSPORTS",
    "Bucket",
    "CollectiveTransport",
    "CudaIpcTransport",
    "ObjectStoreTransport",
    "SendResult",
    "SyncAddress",
    "WeightTransport",
    "WeightUpdate",
]
