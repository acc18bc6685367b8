"""A causal LM's head applied slice by slice: what a learner needs from the logits
(log-probabilities, entropies, argmax tokens) without the (B, T, V) logits of a micro-batch.

For one forward pass the model's output embedding (its LM head) is given a per-slice
function. The model's body runs as usual; the head's input, the final hidden states
(B, T, H), is flattened to positions and cut into slices of at most ``slice_tokens``; each
slice's logits (n, V) go through the function, which reduces them to (n, k), and the
head returns (B, T, k) in place of the logits. With gradients on, each slice runs under an
activation checkpoint (non-reentrant): only its hidden states are kept and its logits are
recomputed in backward, so forward and backward hold one slice's logits at a time, for one
more head matmul per slice (Qwen2.5-7B: the head is about 7% of a token's forward FLOPs).
One slice (a micro-batch within ``slice_tokens``) runs as a plain call, no recomputation.

It happens inside the model's forward, in the head's own call, so what wraps the head's
parameters works as for the logits: FSDP2 holds the root's parameters (the head's among
them) gathered through the model's forward and backward, DeepSpeed ZeRO-3 gathers the head's
around its call and again for its backward, a LoRA adapter on the head runs in its forward,
and compiled or checkpointed decoder layers (``rlsys/models/blocks.py``) are not involved.
A VL model (Qwen2-VL) has its head where a text model has it. A model that changes the
head's output before returning it (Gemma-2's logit soft-capping, Cohere's logit scale) would
change the (B, T, k) values instead of logits: each call checks that the model returned the
head's tensor unchanged and otherwise computes that call again from whole logits and keeps
doing so for that model, with a warning. A model without an output embedding (no
``get_output_embeddings``) is computed from whole logits too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

log = logging.getLogger(__name__)

# logits (n, V) of n positions, and those positions' indices into the flattened (B * T)
# positions -> (n, k): what is kept of each position
SliceFn = Callable[[torch.Tensor, slice], torch.Tensor]
_WHOLE = "_rlsys_whole_logits"  # set on a head whose model post-processes its logits


def output_head(model) -> torch.nn.Module | None:
    """The model's LM head (a DeepSpeed engine passes the lookup to its module); None for a
    model without one."""
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def _slices(
    head_forward,
    hidden: torch.Tensor,
    fn: SliceFn,
    slice_tokens: int | None,
    select: torch.Tensor | None = None,
):
    """``fn`` over the head's logits of ``hidden`` (B, T, H), slice by slice: (B, T, k); with
    ``select`` (indices into the flattened B * T positions) of those positions only: (n, k)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    if select is not None:
        flat = flat.index_select(0, select)
    step = max(1, slice_tokens or len(flat))
    # no position at all (a packed micro-batch with nothing scored): one empty slice
    bounds = [slice(i, min(i + step, len(flat))) for i in range(0, len(flat), step)] or [
        slice(0, 0)
    ]

    def run(part: torch.Tensor, rows: slice) -> torch.Tensor:
        return fn(head_forward(part), rows)

    if len(bounds) == 1 or not torch.is_grad_enabled():
        parts = [run(flat[rows], rows) for rows in bounds]
    else:
        parts = [checkpoint(run, flat[rows], rows, use_reentrant=False) for rows in bounds]
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    if select is None:
        out = out.reshape(*hidden.shape[:-1], -1)
    # a tensor of its own, not a view: FSDP2 hooks its backward on the root's outputs and
    # warns of a view (an in-place op on one would drop the hook); (B, T, k) is a small copy
    return out.clone() if out._base is not None else out


def sliced_forward(
    model,
    fn: SliceFn,
    slice_tokens: int | None,
    select: torch.Tensor | None = None,
    **inputs,
) -> torch.Tensor:
    """``model(**inputs)`` with the head's logits (B, T, V) reduced to ``fn``'s (B, T, k),
    ``slice_tokens`` positions at a time (None: all at once); the model's ``logits_to_keep``
    still picks the positions. ``select``: only these of the flattened B * T positions the
    head is given, (n, k) (a packed micro-batch's scored tokens)."""
    head = output_head(model)
    if head is None or getattr(head, _WHOLE, False):
        logits = model(**inputs).logits
        return _slices(lambda x: x, logits, fn, None, select)
    plain = head.forward
    made: list[torch.Tensor] = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        made.append(_slices(plain, hidden, fn, slice_tokens, select))
        return made[-1]

    before = head.__dict__.get("forward")  # an instance's own forward, if it has one
    head.forward = forward  # for this call only
    try:
        out = model(**inputs).logits
    finally:
        if before is None:
            del head.forward
        else:
            head.forward = before
    # The model may hand on a detached alias (DeepSpeed's hooks do) but nothing computed
    if made and out.shape == made[-1].shape and out.data_ptr() == made[-1].data_ptr():
        return out
    log.warning(
        "%s changes its LM head's output before returning the logits (e.g. soft-capping or "
        "scaling): learner.logits_chunk_tokens cannot slice them, so its log-probabilities "
        "come from whole logits (B, T, V) per micro-batch; lower learner."
        "max_tokens_per_micro_batch if memory runs short",
        type(model).__name__,
    )
    setattr(head, _WHOLE, True)
    return sliced_forward(model, fn, slice_tokens, select, **inputs)
