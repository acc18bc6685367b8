"""What an algorithm config asks of the run, read from the traits its implementations
registered with (``rlsys.registry``): the config holds names only, so these questions are
answered here, where the registries are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlsys.algorithms.estimators import ADVANTAGES
from rlsys.algorithms.policy_losses import POLICY_LOSSES

if TYPE_CHECKING:
    from rlsys.config.algorithm import AlgorithmConfig


def uses_critic(algo: AlgorithmConfig) -> bool:
    """Whether the estimator needs a value model."""
    return ADVANTAGES.trait(algo.advantage, "needs_critic")


def compares_group(algo: AlgorithmConfig) -> bool:
    """Whether the estimator compares the samples of a prompt (rollout.n_samples >= 2)."""
    return ADVANTAGES.trait(algo.advantage, "group")


def uses_pass_k(algo: AlgorithmConfig) -> bool:
    """Whether the estimator's settings have a pass@k ``k`` (which must be below
    rollout.n_samples)."""
    return ADVANTAGES.trait(algo.advantage, "pass_k")


def uses_tree(algo: AlgorithmConfig) -> bool:
    """Whether the estimator reads the tree of tree rollouts (rollout.tree.enabled)."""
    return ADVANTAGES.trait(algo.advantage, "tree")


def uses_turns(algo: AlgorithmConfig) -> bool:
    """Whether the estimator reads the model turns of multi-turn trajectories (needs
    task.env.name)."""
    return ADVANTAGES.trait(algo.advantage, "multi_turn")


def has_ratio(algo: AlgorithmConfig) -> bool:
    """Whether the policy loss has an importance ratio (several optimizer steps per batch and
    stale samples stay correct)."""
    return POLICY_LOSSES.trait(algo.policy_loss, "ratio")
