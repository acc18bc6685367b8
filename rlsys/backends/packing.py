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


def packed_micro_batches(
    rank_units: list[np.ndarray], lengths: np.ndarray, capacity: int, per_micro: int, rank: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's micro-batches as (rows, packed row of each row), packed rows numbered
    from 0 within each micro-batch.

    ``rank_units``: every rank's units, a (units, rows per unit) array of row indices each
    (one row per unit, or a preference pair's two); a unit's length is its rows' real
    ``lengths`` summed, and its rows stay together, in order. All ranks get the same number
    of micro-batches: as many as the rank with the most bins needs."""
    bins = [first_fit_decreasing(lengths[units].sum(-1), capacity) for units in rank_units]
    count = max(1, max(math.ceil(len(b) / per_micro) for b in bins))
    units, mine = rank_units[rank], bins[rank]
    out = []
    for chunk in np.array_split(np.arange(len(mine)), count):
        rows = [units[mine[j]].reshape(-1) for j in chunk]
        packed = [np.full(len(r), k, dtype=np.int64) for k, r in enumerate(rows)]
        if not rows:
            rows = packed = [np.zeros(0, dtype=np.int64)]
        out.append((np.concatenate(rows), np.concatenate(packed)))
    return out
