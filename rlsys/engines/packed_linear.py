"""A CPU engine's linear layers with their weights prepacked for oneDNN
(``rollout.engine_args.prepack``), sibling layers that read one input fused into one
(``fuse_linears``).

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

**Fused siblings.** A transformers decoder layer multiplies one input by three weights for
attention (``q_proj``, ``k_proj``, ``v_proj``) and by two in its MLP (``gate_proj``,
``up_proj``), one call each. With ``fuse`` the siblings' weights are packed as one
(concatenated by rows) and the first sibling called computes them all at once: its own slice
is returned, the others' are kept for their own calls, which take them when they come with
the same input tensor, unchanged since (its ``_version``; a change through ``.data`` or
another alias of its storage would not show there, and transformers' layers make none); any
other call computes afresh, and an inference-mode tensor, which has no version, is never
kept for. What a forward left unclaimed (a layer that calls only ``q_proj``) is forgotten at
the end of each ``generate`` (``forget``). At SmolLM2's shapes each output column came out
bit-equal to the layer packed alone, fp32 and bf16 (oneDNN reduces a column over the inputs
in the same order whatever the width; tests/unit/test_packed_linear.py checks it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACKABLE = (torch.float32, torch.bfloat16)
# child names of sibling linear layers that transformers' decoder layers call with one input
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


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


def sibling_groups(model: torch.nn.Module) -> list[tuple[torch.nn.Linear, ...]]:
    """Every set of plain linear layers named in ``SIBLINGS`` under one module, of one input
    width, dtype and bias presence (so their weights can be packed as one)."""
    groups = []
    for module in model.modules():
        for names in SIBLINGS:
            layers = tuple(getattr(module, name, None) for name in names)
            if not all(type(layer) is torch.nn.Linear for layer in layers):
                continue
            kinds = {
                (layer.in_features, layer.weight.dtype, layer.bias is None) for layer in layers
            }
            if len(kinds) == 1:
                groups.append(layers)
    return groups


def _pack(weight: torch.Tensor, rows_hint: int) -> torch.Tensor:
    """``weight`` (out, in) reordered into oneDNN's blocked layout for ~``rows_hint`` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows_hint)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x`` (..., in) times a packed weight, plus ``bias``."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out.shape[-1])


class _Group:
    """Sibling layers packed as one: the packed weight, its bias, and the outputs computed
    for siblings not yet called (id(layer) -> (input, its _version, output))."""

    def __init__(self, layers: tuple[torch.nn.Linear, ...]) -> None:
        self.layers = layers
        self.sizes = [layer.out_features for layer in layers]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.kept: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}

    def pack(self, rows_hint: int) -> None:
        self.weight = _pack(torch.cat([layer.weight.detach() for layer in self.layers]), rows_hint)
        if self.layers[0].bias is not None:
            self.bias = torch.cat([layer.bias.detach() for layer in self.layers])

    def drop(self) -> None:
        self.weight, self.bias = None, None
        self.kept.clear()

    def output(self, layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """``layer``'s output for ``x``: kept from a sibling's call on it, or all computed."""
        versioned = not x.is_inference()  # inference tensors have no version counter
        kept = self.kept.pop(id(layer), None)
        if kept is not None and versioned and kept[0] is x and kept[1] == x._version:
            return kept[2]
        parts = _linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
        for sibling, part in zip(self.layers, parts, strict=True):
            if sibling is not layer and versioned:
                self.kept[id(sibling)] = (x, x._version, part)
        return parts[self.layers.index(layer)]


class PackedLinears:
    """The model's plain linear layers, computed from prepacked weights while ``packed``;
    with ``fuse``, sibling layers (``sibling_groups``) from one weight per group."""

    def __init__(self, model: torch.nn.Module, rows_hint: int, fuse: bool = True) -> None:
        self.rows_hint = rows_hint  # the batch rows the layout is tuned for
        self.layers = [m for m in model.modules() if type(m) is torch.nn.Linear]
        self.groups = [_Group(layers) for layers in sibling_groups(model)] if fuse else []
        group_of = {id(layer): group for group in self.groups for layer in group.layers}
        self.alone = [layer for layer in self.layers if id(layer) not in group_of]
        self.weights: dict[int, torch.Tensor] = {}  # id(layer) -> packed weight; {}: none
        self._packed = False
        for layer in self.layers:
            layer.forward = self._forward_of(layer, group_of.get(id(layer)))

    def _forward_of(self, layer: torch.nn.Linear, group: _Group | None):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if not self._packed or x.dtype != layer.weight.dtype or torch.is_grad_enabled():
                return F.linear(x, layer.weight, layer.bias)
            if group is not None:
                return group.output(layer, x)
            return _linear(x, self.weights[id(layer)], layer.bias)

        return forward

    @property
    def packed(self) -> bool:
        """Whether the layers compute from packed weights (until the next ``drop``)."""
        return self._packed

    def pack(self) -> None:
        """Pack every layer's current weight (a no-op while packed)."""
        if self._packed:
            return
        for layer in self.alone:
            self.weights[id(layer)] = _pack(layer.weight, self.rows_hint)
        for group in self.groups:
            group.pack(self.rows_hint)
        self._packed = True

    def forget(self) -> None:
        """Drop the outputs kept for siblings not called yet (the end of a ``generate``)."""
        for group in self.groups:
            group.kept.clear()

    def drop(self) -> None:
        """Forget the packed copies: the weights changed, or their memory is wanted."""
        self.weights.clear()
        for group in self.groups:
            group.drop()
        self._packed = False
