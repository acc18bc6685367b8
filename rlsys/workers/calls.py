"""Waiting on calls to a group of actors."""

from __future__ import annotations

import ray


def get_all(refs: list[ray.ObjectRef]) -> list:
    """``ray.get`` that raises the first failure as soon as it happens: in a collective, the
    other members would otherwise sit in the group until its timeout."""
    if len(refs) == 1:  # nothing to wait out: one round trip instead of three
        return ray.get(refs)
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)
    return ray.get(refs)
