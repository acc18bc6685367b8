"""A CPU engine's linear layers with their weights prepacked for oneDNN
(``rollout.engine_args.prepack``).

``F.linear`` on a CPU reorders the weight into the matmul kernel's blocked layout on every
call; for a decode step's few rows (one token a row) that reorder costs as much as the
multiply. Packed once per weight version (``torch.ops.mkldnn._reorder_linear_weight``, the
layout torch.compile's CPU backend freezes weights into) and multiplied with
``torch.ops.mkldnn._linear_pointwise``, a SmolLM2-135M decode step at batch 16 took 55 ms
against 67 ms (bf16, 2-core EPYC; the logits bit-equal), for 0.14 s of packing after each
weight load and a second copy of the linear weights in memory (docs/roofline.md,
"Prepacked weights").

``PackedLinears`` replaces the ``forward`` of every plain ``nn.Linear`` in the model by one
that uses the packed weight when there is a current one and the call needs no gradient, and
``F.linear`` otherwise. The engine packs (``pack``) at the start of a ``generate`` after the
weights changed and drops the packed copies (``drop``) when it loads new weights or sleeps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACKABLE = (torch.float32, torch.bfloat16)


def can_prepack(model: torch.nn.Module) -> bool:
    """Whether this torch can prepack ``model``'s weights: a CPU model of fp32 or bf16 (bf16
    only where oneDNN supports it on this CPU)."""
    mkldnn = torch.backends.mkldnn
    if not mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    dtypes = {p.dtype for p in model.parameters()}
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cpu"} or not dtypes <= set(PACKABLE):
        return False
    return torch.bfloat16 not in dtypes or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinears:
    """The model's plain linear layers, computed from prepacked weights while ``packed``."""

    def __init__(self, model: torch.nn.Module, rows_hint: int) -> None:
        self.rows_hint = rows_hint  # the batch rows the layout is tuned for
        self.layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
        self.weights: dict[int, torch.Tensor] = {}  # id(layer) -> packed weight; {}: none
        for layer in self.layers:
            layer.forward = self._forward_of(layer)

    def _forward_of(self, layer: torch.nn.Linear):
        def forward(x: torch.Tensor) -> torch.Tensor:
            weight = self.weights.get(id(layer))
            if weight is None or x.dtype != layer.weight.dtype or torch.is_grad_enabled():
                return F.linear(x, layer.weight, layer.bias)
            flat = x.reshape(-1, x.shape[-1])
            out = torch.ops.mkldnn._linear_pointwise(flat, weight, layer.bias, "none", [], "")
            return out.reshape(*x.shape[:-1], out.shape[-1])

        return forward

    @property
    def packed(self) -> bool:
        """Whether the layers compute from packed weights (until the next ``drop``)."""
        return bool(self.weights)

    def pack(self) -> None:
        """Pack every layer's current weight (a no-op while packed)."""
        if self.packed:
            return
        for layer in self.layers:
            weight = layer.weight.detach()
            self.weights[id(layer)] = torch.ops.mkldnn._reorder_linear_weight(
                weight, self.rows_hint
            )

    def drop(self) -> None:
        """Forget the packed copies: the weights changed, or their memory is wanted."""
        self.weights.clear()
