"""Packed forward passes (``learner.packing``): the sequences of a micro-batch concatenated
into a few rows, each sequence attending only to itself, and the outputs laid back out as
the unpacked path's (B, T-1).

A micro-batch's rows (left-padded prompt, response, right padding; any padding inside a row
is dropped too) are packed by the plan's ``packed_rows`` (``rlsys/backends/packing.py``):
row ``b``'s real tokens go, in order, after the earlier rows of its packed row. Position ids
restart at 0 per sequence and count real tokens, as ``position_ids`` does unpacked. The
attention mask is block-diagonal causal, a (P, 1, L, L) mask handed to the model as its
``attention_mask`` (transformers passes a 4D mask through as it is): boolean for SDPA (also
the fp32 SDPA of ``attention.py``), additive for eager attention. A packed row's trailing
padding is one more block, so no query row is fully masked (SDPA would give NaN there).
Flash-attention's varlen path (position ids only, GPUs) is not wired: a model using it
raises.

Shared prompts (``learner.share_prompts``, ``pack_rows``' ``share_until``): rows of a packed row
that agree up to a column (a group's samples: their prompt) hold those tokens once; each
other row's later tokens attend to that copy and to themselves, positions continuing the
prompt's. The training-side twin of prefilling a prompt once per group; Prefix Grouper (Liu
et al. 2025, arXiv 2506.05433) does the same with attention split into a prefix and a suffix
part, here it is one forward under the packed row's mask, so nothing else changes.

Only the positions the unpacked path computes and a loss can read are computed: a real
token whose next token is real, from the micro-batch's first scored column on. The others
hold 0 (unpacked, a position whose target is padding holds a meaningless number; no loss
mask covers it). The LM head runs on those positions only (``sliced_forward``'s ``select``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlsys.data.collate import position_ids
from rlsys.models.attention import DECODE_MATMUL, FP32_SDPA
from rlsys.models.lm_head import sliced_forward
from rlsys.models.logprobs import logprob_slices

_BOOL_MASKS = ("sdpa", FP32_SDPA, DECODE_MATMUL)


@dataclass
class PackedRows:
    """A micro-batch packed: P rows of L tokens, and where each real token went."""

    input_ids: torch.Tensor  # (P, L) the rows' real tokens, concatenated; 0 after them
    position_ids: torch.Tensor  # (P, L) restarting at 0 per sequence
    mask: torch.Tensor  # (P, 1, L, L) bool: query attends key (same sequence, not later)
    index: torch.Tensor  # (B, T) int64 flat index into P * L of each real token; -1 on padding


def _prompt_owners(
    input_ids: torch.Tensor, real: torch.Tensor, packed_row: torch.Tensor, until: int
) -> torch.Tensor:
    """(B,) for each row, the first row of its packed row with the same tokens in columns
    ``0..until`` (itself when none before it has them)."""
    heads = torch.where(real[:, : until + 1], input_ids[:, : until + 1], -1).tolist()
    first: dict[tuple, int] = {}
    rows = zip(packed_row.tolist(), heads, strict=True)
    owner = [first.setdefault((k, *h), b) for b, (k, h) in enumerate(rows)]
    return torch.tensor(owner, device=input_ids.device)


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    packed_row: torch.Tensor,
    share_until: int | None = None,
) -> PackedRows:
    """Pack the (B, T) rows into rows ``packed_row`` (B,), in row order within each.

    ``share_until`` (``learner.share_prompts``): rows of one packed row with the same tokens
    in columns ``0..share_until`` (a group's samples: its prompt) hold them once, in the
    first such row's place; the others' later tokens attend to those and to their own."""
    real = attention_mask.bool()
    own = torch.arange(len(real), device=real.device)
    owner, placed = own, real  # whose copy of a shared token a row reads; tokens placed
    shared = torch.zeros_like(real)  # an owner's tokens that other rows read
    if share_until is not None:
        owner = _prompt_owners(input_ids, real, packed_row, share_until)
        head = torch.arange(real.shape[1], device=real.device) <= share_until
        placed = real & ~((owner != own)[:, None] & head)
        readers = torch.zeros_like(own, dtype=torch.bool)
        readers[owner[owner != own]] = True
        shared = placed & readers[:, None] & head
    lengths = placed.sum(-1)
    count = int(packed_row.max()) + 1
    member = torch.nn.functional.one_hot(packed_row, count) * lengths[:, None]  # (B, P)
    start = (member.cumsum(0) - member).gather(1, packed_row[:, None])[:, 0]  # offset in row
    width = max(int(member.sum(0).max()), 1)
    rank = position_ids(real.long())  # real tokens before this one in its row
    column = start[:, None] + position_ids(placed.long())
    index = torch.where(placed, packed_row[:, None] * width + column, -1)
    # a shared token is its owner's, in the same column (the rows agree there)
    index = torch.where(real & ~placed, index[owner], index)
    flat = index[placed]
    size = count * width
    ids = input_ids.new_zeros(size).index_copy(0, flat, input_ids[placed])
    positions = torch.arange(width, device=ids.device).repeat(count)
    positions = positions.index_copy(0, flat, rank[placed])
    # sequence of every packed token: its row, or one block per packed row's padding
    rows = own[:, None].expand_as(real)
    seq = torch.full((size,), len(real), device=ids.device).index_copy(0, flat, rows[placed])
    # the row whose shared tokens each packed token may also attend to (its owner's)
    reads = torch.full_like(seq, len(real)).index_copy(0, flat, owner[rows[placed]])
    shared = torch.zeros(size, dtype=torch.bool, device=ids.device).index_copy(
        0, flat, shared[placed]
    )
    filled = member.sum(0)  # padding counts positions from 0 after each row's tokens
    pad_pos = torch.arange(width, device=ids.device)[None] - filled[:, None]
    positions = torch.where(
        seq.view(count, width) == len(real), pad_pos, positions.view(count, width)
    )
    seq, reads, shared = (x.view(count, width) for x in (seq, reads, shared))
    causal = torch.ones(width, width, dtype=torch.bool, device=ids.device).tril()
    same = seq[:, :, None] == seq[:, None, :]
    prompt = shared[:, None, :] & (reads[:, :, None] == seq[:, None, :])
    mask = (same | prompt) & causal
    return PackedRows(ids.view(count, width), positions, mask[:, None], index)


def attention_mask_for(model, mask: torch.Tensor) -> torch.Tensor:
    """``mask`` as ``model``'s attention implementation takes a 4D mask (an additive one in the
    model's dtype for eager attention); ValueError naming ``learner.packing`` for one that
    takes none (flash-attention's varlen path)."""
    module = getattr(model, "module", model)  # a DeepSpeed engine's model
    config = getattr(module, "config", None) or module.backbone.config
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl in _BOOL_MASKS:
        return mask
    if impl == "eager":
        dtype = next(model.parameters()).dtype
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
            ~mask, torch.finfo(dtype).min
        )
    raise ValueError(
        f"learner.packing=true: the model's attention implementation {impl!r} takes no "
        "block-diagonal mask (packing supports sdpa and eager); set learner.packing=false"
    )


def _scored(packed: PackedRows, first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, columns) of the (B, T-1) positions computed packed: a real token whose next
    token is real, at column ``first`` or later."""
    real = packed.index >= 0
    pairs = real[:, :-1] & real[:, 1:]
    pairs[:, :first] = False
    return pairs.nonzero(as_tuple=True)


def _lay_out(values: torch.Tensor, rows, columns, shape) -> torch.Tensor:
    """(n, k) values of the positions (rows, columns) as (B, T-1, k), 0 elsewhere."""
    flat = rows * shape[1] + columns
    out = values.new_zeros(shape[0] * shape[1], values.shape[-1]).index_copy(0, flat, values)
    return out.view(*shape, -1)


def packed_token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    packed_row: torch.Tensor,
    temperature: float = 1.0,
    first: int = 0,
    entropy: bool = False,
    entropy_grad: bool = False,
    slice_tokens: int | None = None,
    share_until: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``token_logprobs`` computed on packed rows (``packed_row``: each row's packed row),
    returned in its (B, T-1) layout (see the module docstring for the positions held 0).
    ``share_until``: as ``pack_rows``' (rows agreeing up to that column share those tokens)."""
    packed = pack_rows(input_ids, attention_mask, packed_row, share_until)
    rows, columns = _scored(packed, first)
    targets = input_ids[rows, columns + 1][:, None]
    with_grad = entropy_grad and torch.is_grad_enabled()
    stats = sliced_forward(
        model,
        logprob_slices(targets, temperature, entropy, with_grad),
        slice_tokens,
        select=packed.index[rows, columns],
        input_ids=packed.input_ids,
        attention_mask=attention_mask_for(model, packed.mask),
        position_ids=packed.position_ids,
        use_cache=False,
    )
    shape = (input_ids.shape[0], input_ids.shape[1] - 1)
    out = _lay_out(stats, rows, columns, shape)
    if not entropy:
        return out[..., 0], None
    ent = out[..., 1] if with_grad else out[..., 1].detach()
    return out[..., 0], ent


def packed_token_values(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    packed_row: torch.Tensor,
    share_until: int | None = None,
) -> torch.Tensor:
    """``token_values`` of the critic computed on packed rows, in its (B, T-1) layout: the
    value of every real token whose next token is real, 0 elsewhere. ``share_until``: as
    ``pack_rows``' (rows agreeing up to that column share those tokens' values)."""
    packed = pack_rows(input_ids, attention_mask, packed_row, share_until)
    rows, columns = _scored(packed, 0)
    values = model(
        packed.input_ids,
        attention_mask_for(model, packed.mask),
        packed.position_ids,
    )
    picked = values.reshape(-1).index_select(0, packed.index[rows, columns])
    shape = (input_ids.shape[0], input_ids.shape[1] - 1)
    return _lay_out(picked[:, None], rows, columns, shape)[..., 0]
