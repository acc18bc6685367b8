"""Weight transports from learners to rollout engines."""

from rlsys.registry import Registry
from rlsys.weight_sync.base import Bucket, WeightTransport, WeightUpdate
from rlsys.weight_sync.object_store import ObjectStoreTransport

TRANSPORTS: Registry = Registry("weight transport", "weight_sync.transport")
TRANSPORTS.register("object_store")(ObjectStoreTransport)

__all__ = ["TRANSPORTS", "Bucket", "ObjectStoreTransport", "WeightTransport", "WeightUpdate"]
