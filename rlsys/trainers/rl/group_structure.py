"""What an advantage estimator reads from a step's groups besides the packed batch."""

from __future__ import annotations

import numpy as np

from rlsys.algorithms.estimators import ADVANTAGES
from rlsys.data.collate import batch_turns
from rlsys.pipeline.tree import tree_segments
from rlsys.types import RolloutGroup


def group_structure(groups: list[RolloutGroup], advantage: str) -> dict:
    """``Recipe.advantages``' keyword arguments taken from ``groups`` (rows in batch order):
    ReMax's greedy baseline (the shaped reward of each prompt's greedy reply, per sample) when
    the estimator wants one, the tree segments of tree rollouts and the model turns of multi-turn
    trajectories (None where the groups have none)."""
    baseline = None
    if ADVANTAGES.trait(advantage, "greedy_baseline"):
        baseline = np.array([g.baseline.reward for g in groups for _ in g.samples], np.float32)
    return {
        "baseline_rewards": baseline,
        "tree_segments": tree_segments(groups),
        "turns": batch_turns(groups),
    }
