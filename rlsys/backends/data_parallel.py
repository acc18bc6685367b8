"""How a batch is split over data-parallel ranks, mini-batches and micro-batches.

Every rank receives the whole batch and computes the same plan, so each knows its rows and
the global token count of every mini-batch (for an exact token mean across ranks). All ranks
get the same number of micro-batches, because FSDP collectives must line up; a rank with
fewer rows gets empty micro-batches, which the backend runs as a masked dummy row.

How large a micro-batch is comes from one place, ``micro_batch_rows``: at most
``learner.micro_batch_size`` rows and at most ``learner.max_tokens_per_micro_batch`` tokens
(rows x the batch's padded length), at least one row; every pass (the train step and the
forward-only passes: log-probabilities, values, scores, greedy tokens) of every backend cuts
its rows with it. Unpacked (the default), every row of a batch has its padded length; with
``learner.packing`` the rows' sequences are packed into rows of the padded length
(``packing.py``), as many packed rows a micro-batch as there would be padded ones. A
micro-batch's gradient is a sum the loss weights make independent of the cut, so only memory
and speed depend on it, never the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from rlsys.backends.packing import PackInputs, packed_micro_batches


@dataclass
class MiniBatchPlan:
    """One optimizer step: this rank's micro-batches and the global token count."""

    micro_batches: list[np.ndarray]  # row indices per micro-batch (may be empty)
    global_tokens: float  # loss-mask tokens in this mini-batch over all ranks
    global_seqs: float  # sequences with a loss-mask token in this mini-batch over all ranks
    # learner.packing: per micro-batch, the packed row of each of its rows (None: unpacked)
    packed_rows: list[np.ndarray] | None = None


def micro_batch_rows(max_rows: int, max_tokens: int | None, length: int) -> int:
    """Rows per micro-batch of sequences padded to ``length`` tokens: at most ``max_rows``,
    at most as many as fit ``max_tokens`` (None: no token bound), at least one."""
    if max_tokens is None:
        return max_rows
    return max(1, min(max_rows, max_tokens // max(length, 1)))


def _equal_micro_batches(rank_rows: list[np.ndarray], rank: int, micro: int) -> list[np.ndarray]:
    count = max(1, max(math.ceil(len(rows) / micro) for rows in rank_rows))
    return np.array_split(rank_rows[rank], count)


def forward_plan(num_rows: int, world_size: int, rank: int, micro: int) -> list[np.ndarray]:
    """Micro-batches of rows this rank scores in a forward-only pass."""
    rank_rows = np.array_split(np.arange(num_rows), world_size)
    return _equal_micro_batches(rank_rows, rank, micro)


def packed_forward_plan(
    pack: PackInputs, length: int, world_size: int, rank: int, micro: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``forward_plan`` packed (``learner.packing``): this rank's micro-batches as (rows,
    packed row of each), at most ``micro`` packed rows of ``length`` tokens (the batch's
    padded length) each, or fewer longer ones holding a prompt's rows (``PackInputs``)."""
    rank_rows = np.array_split(np.arange(len(pack.lengths)), world_size)
    units = [pack.units(r, 1, length) for r in rank_rows]
    return packed_micro_batches(units, pack, length, micro, rank)


def train_plan(
    loss_mask: np.ndarray,
    world_size: int,
    rank: int,
    num_mini_batches: int,
    micro: int,
    seed: int,
    group: int = 1,
    pack: PackInputs | None = None,
    skip: np.ndarray | None = None,
) -> list[MiniBatchPlan]:
    """Shuffle rows, cut them into mini-batches, and give each rank its share of each.

    ``group`` consecutive rows move together (a preference pair's chosen and rejected rows,
    ``group=2``): they are shuffled as a unit and never split between ranks or
    micro-batches, which then hold ``max(1, micro // group)`` groups. Mini-batches without a
    loss token (more mini-batches than rows) are left out, so the backend never takes an
    optimizer step on nothing.

    ``pack`` (``learner.packing``): micro-batches are packed, each of at most
    ``max(1, micro // group)`` packed rows of ``group`` x the batch's padded length tokens (or
    fewer longer ones holding a prompt's rows: ``PackInputs``), and the plans carry
    ``packed_rows``.

    ``skip`` ((B,) bool, ``objective.inert_rows``): rows whose loss and gradient are zero
    whatever the model computes are left out of the micro-batches (a group when all its rows
    are), after the shuffle and the cut into mini-batches and while still counted in the
    mini-batch's ``global_tokens`` and ``global_seqs``: every loss weight, and so the
    gradient, is the one without the skip. A mini-batch left with no rows still takes its
    optimizer step (empty micro-batches: AdamW's step on a zero gradient is not nothing).
    """
    rows = loss_mask.shape[0]
    if rows % group:
        raise ValueError(f"{rows} rows do not split into groups of {group}")
    order = np.random.default_rng(seed).permutation(rows // group)
    plans = []
    for mini in np.array_split(order, num_mini_batches):
        mini_rows = _expand(mini, group)
        tokens = float(loss_mask[mini_rows].sum())
        if tokens == 0:  # nothing to learn: no optimizer step (the same on every rank)
            continue
        seqs = float((loss_mask[mini_rows].sum(-1) > 0).sum())
        if skip is not None:
            mini = mini[~skip.reshape(-1, group).all(-1)[mini]]
        rank_groups = np.array_split(np.sort(mini), world_size)
        per_micro = max(1, micro // group)
        if pack is None:
            micro_groups = _equal_micro_batches(rank_groups, rank, per_micro)
            plans.append(MiniBatchPlan([_expand(g, group) for g in micro_groups], tokens, seqs))
            continue
        # a packed row holds a group's rows at their padded length, whatever they are
        capacity = group * (loss_mask.shape[1] + 1)
        units = [pack.units(_expand(g, group), group, capacity) for g in rank_groups]
        packed = packed_micro_batches(units, pack, capacity, per_micro, rank)
        plans.append(MiniBatchPlan([m[0] for m in packed], tokens, seqs, [m[1] for m in packed]))
    return plans


def _expand(groups: np.ndarray, group: int) -> np.ndarray:
    """Row indices of ``groups`` (each ``group`` consecutive rows), in order."""
    if group == 1:
        return groups
    return (groups[:, None] * group + np.arange(group)).reshape(-1)


def padding_fraction(
    attention_mask: np.ndarray, world_size: int, micro: int, pack: PackInputs | None
) -> float:
    """Share of the positions a forward pass over the batch computes that are padding: of
    its rows x padded length, or packed (``learner.packing``) of its packed micro-batches,
    each as many packed rows as it has x its longest packed row (``micro`` rows a
    micro-batch at most, ``world_size`` ranks; empty micro-batches left out). Shared prompts
    count as real once per packed row (``pack.size``)."""
    if pack is None:
        return 1.0 - float(attention_mask.sum()) / max(attention_mask.size, 1)
    real = computed = 0.0
    for rank in range(world_size):
        plan = packed_forward_plan(pack, attention_mask.shape[1], world_size, rank, micro)
        for rows, packed_row in plan:
            if len(rows):
                fill = [pack.size(rows[packed_row == k]) for k in range(packed_row.max() + 1)]
                real += sum(fill)
                computed += len(fill) * max(fill)
    return 1.0 - real / max(computed, 1.0)
