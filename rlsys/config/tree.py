"""Config of tree rollouts (``rollout.tree``): see docs/sampling.md and ``rlsys.pipeline.tree``."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.checks import positive
from rlsys.config.errors import ConfigError


@dataclass
class TreeConfig:
    """``rollout.tree``: a group's ``rollout.n_samples`` replies are the leaves of a tree
    whose nodes are segments of tokens, each node's children continuing its prefix (TreePO,
    Li et al. 2025). Every node with more than one leaf below it generates
    ``segment_tokens`` tokens, then splits its leaves among ``branching`` children; a node
    with one leaf generates to the end of the reply. The depth is derived: a reply shares
    its first ceil(log_branching(n_samples)) - 1 segments (n_samples=8, branching=2: 2)
    with other leaves, then goes its own way. See docs/sampling.md."""

    enabled: bool = False  # false: the n replies of a prompt are sampled independently (flat)
    branching: int = 2  # children per node (the root's too: the prompt's first divergence)
    segment_tokens: int = 64  # tokens per shared segment (a node above the leaves)

    def __post_init__(self) -> None:
        positive("rollout.tree.segment_tokens", self.segment_tokens)
        if self.branching < 2:
            raise ConfigError(
                f"rollout.tree.branching={self.branching} must be >= 2 (a node with one child "
                "shares nothing); set rollout.tree.branching=2 or more"
            )
