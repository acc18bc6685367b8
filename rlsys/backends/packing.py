"""Sequence packing's plan (``learner.packing``): which rows share a micro-batch and which
packed row each one joins.

Packed, a micro-batch is a few rows of concatenated sequences instead of one padded row per
sequence: each rank's rows (or a preference objective's groups of rows, which stay
together) go into bins of ``capacity`` tokens by first-fit decreasing on their real
(unpadded) lengths, and the bins into micro-batches of at most ``per_micro`` bins. A bin
becomes one packed row, so a micro-batch's tensors are at most ``per_micro x capacity``
tokens: the same bound as the unpadded plan's ``rows x padded length`` when ``capacity`` is
the batch's padded length (times the group size, with ``per_micro`` divided by it), but
with the padding squeezed out. As in ``data_parallel.py``, every rank computes every rank's
bins, so all ranks run the same number of micro-batches (a rank with fewer gets empty ones).
Deterministic: ties in length keep index order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def first_fit_decreasing(sizes: np.ndarray, capacity: int) -> list[np.ndarray]:
    """Bins of item indices, each bin's sizes summing to at most ``capacity``: items taken
    longest first (equal sizes: lower index first), each into the first bin with room; a
    bin's indices in ascending order. ValueError for an item larger than ``capacity``."""
    order = np.argsort(-np.asarray(sizes), kind="stable")
    room = np.zeros(len(order), dtype=np.int64)  # free tokens of each opened bin
    members: list[list[int]] = []
    for item in order:
        size = int(sizes[item])
        if size > capacity:
            raise ValueError(
                f"a sequence (or group of rows) of {size} tokens does not fit a packed row of "
                f"{capacity} tokens; set learner.packing=false"
            )
        fits = np.flatnonzero(room[: len(members)] >= size)
        if len(fits):
            members[fits[0]].append(int(item))
            room[fits[0]] -= size
        else:
            members.append([int(item)])
            room[len(members) - 1] = capacity - size
    return [np.sort(np.array(m, dtype=np.int64)) for m in members]


@dataclass
class PackInputs:
    """What the plans pack by: each row's real tokens and, with ``learner.share_prompts``,
    which rows share a prompt (equal ids) and that prompt's real tokens."""

    lengths: np.ndarray  # (B,)
    prompts: np.ndarray | None = None  # (B,) prompt id of each row
    prompt_lengths: np.ndarray | None = None  # (B,)

    @classmethod
    def of(
        cls,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        loss_mask: np.ndarray,
        share_prompts: bool,
    ) -> PackInputs:
        """A batch's: with ``share_prompts``, rows whose tokens agree up to the batch's first
        trained column (its prompts' end, in ``collate.pack``'s layout) share them."""
        lengths = attention_mask.sum(-1)
        trained = np.flatnonzero(loss_mask.any(0))
        if not share_prompts or not len(trained) or trained[0] == 0:
            return cls(lengths)
        head = slice(0, int(trained[0]) + 1)
        keys = np.where(attention_mask[:, head] > 0, input_ids[:, head], -1)
        _, prompts = np.unique(keys, axis=0, return_inverse=True)
        return cls(lengths, prompts.reshape(-1), attention_mask[:, head].sum(-1))

    def units(self, rows: np.ndarray, group: int, cap: int) -> list[np.ndarray]:
        """``rows`` (in order) as the units a packed row takes whole: ``group`` consecutive
        rows each; sharing prompts (``group`` 1), a prompt's rows together where the prompt
        is at least as long as their mean reply, in chunks of at most ``max(cap, 4 x the
        prompt)`` tokens. A packed row's attention is a dense L x L mask, so a prompt shared
        by long replies saves little and costs L squared: those rows stay apart."""
        if self.prompts is None or group > 1:
            return list(rows.reshape(-1, group))
        out = []
        for prompt in dict.fromkeys(self.prompts[rows].tolist()):  # first-seen order
            mine = rows[self.prompts[rows] == prompt]
            head = int(self.prompt_lengths[mine[0]])
            if head < (self.lengths[mine] - head).mean():
                out.extend(mine[:, None])
                continue
            limit = max(cap, 4 * head)
            chunk, size = [], head  # a chunk's tokens: the prompt once, then each reply
            for row in mine.tolist():
                reply = int(self.lengths[row]) - head
                if chunk and size + reply > limit:
                    out.append(np.array(chunk))
                    chunk, size = [], head
                chunk.append(row)
                size += reply
            out.append(np.array(chunk))
        return out

    def size(self, unit: np.ndarray) -> int:
        """Tokens ``unit``'s rows take packed: their real tokens, each prompt once."""
        total = int(self.lengths[unit].sum())
        if self.prompts is None:
            return total
        _, first = np.unique(self.prompts[unit], return_index=True)
        return total - int(self.prompt_lengths[unit].sum() - self.prompt_lengths[unit][first].sum())


def packed_micro_batches(
    rank_units: list[list[np.ndarray]],
    pack: PackInputs,
    capacity: int,
    per_micro: int,
    rank: int,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's micro-batches as (rows, packed row of each row), packed rows numbered
    from 0 within each micro-batch.

    ``rank_units``: every rank's units, each an array of row indices that stay together, in
    order (one row, a preference pair's two, or a prompt's rows: ``PackInputs.units``); a
    unit's length is ``pack.size``. A packed row holds at least ``capacity`` tokens and at
    least its largest unit; when the largest exceeds ``capacity``, a micro-batch holds
    proportionally fewer packed rows than ``per_micro``, so its tokens stay within
    ``per_micro x capacity``. All ranks get the same number of micro-batches: as many as the
    rank with the most bins needs."""
    sizes = [np.array([pack.size(u) for u in units], dtype=np.int64) for units in rank_units]
    largest = max((int(s.max()) for s in sizes if len(s)), default=0)
    if largest > capacity:
        per_micro = max(1, per_micro * capacity // largest)
        capacity = largest
    bins = [first_fit_decreasing(s, capacity) for s in sizes]
    count = max(1, max(math.ceil(len(b) / per_micro) for b in bins))
    units, mine = rank_units[rank], bins[rank]
    out = []
    for chunk in np.array_split(np.arange(len(mine)), count):
        rows = [np.concatenate([units[i] for i in mine[j]]) for j in chunk]
        packed = [np.full(len(r), k, dtype=np.int64) for k, r in enumerate(rows)]
        if not rows:
            rows = packed = [np.zeros(0, dtype=np.int64)]
        out.append((np.concatenate(rows), np.concatenate(packed)))
    return out
