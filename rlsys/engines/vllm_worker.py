"""Runs inside every vLLM worker process: the weight-loading entry point rlsys calls by name.

vLLM imports this module in each worker (``worker_extension_cls``) before the model loads,
so it is also where the CPU compatibility fix is applied for tensor-parallel workers, which
live in processes of their own.
"""

from __future__ import annotations

from rlsys.engines import vllm_cpu_compat

vllm_cpu_compat.apply()  # before the model loads; a no-op on GPU and where not needed


class WeightLoaderExtension:
    """Mixed into vLLM's worker class; called through ``LLM.collective_rpc("load_bucket")``."""

    def load_bucket(self, bucket: dict) -> int:
        """Load full tensors; vLLM's loaders fuse (q/k/v, gate/up), slice for this
        tensor-parallel rank, cast dtypes and skip tied copies. Returns tensors taken."""
        self.model_runner.model.load_weights(weights=iter(bucket.items()))
        return len(bucket)

    def load_packed(self, slices: list, flat: bytes) -> int:
        """``load_bucket`` for a bucket packed into bytes (``weight_sync.base.pack``): how
        buckets cross vLLM's RPC (msgpack: tensors and arrays arrive as lists) to
        tensor-parallel worker processes."""
        import torch

        from rlsys.weight_sync.base import TensorSlice, unpack

        buffer = torch.frombuffer(bytearray(flat), dtype=torch.uint8)
        return self.load_bucket(unpack([TensorSlice(*item) for item in slices], buffer))
