"""Config of tree rollouts (``rollout.tree``): see docs/sampling.md and ``rlsys.pipeline.tree``."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.checks import positive
from rlsys.config.errors import ConfigError


@dataclass
class TreeConfig:
    """``rollout.tree``: a group's ``rollout.n_samples`` replies are the leaves of a tree
    whose nodes are segments of tokens, each node's children continuing its prefix; the
    engines generate a shared segment once. Two ways to grow it (``mode``):

    - ``fixed`` (TreePO, Li et al. 2025): every node with more than one leaf below it
      generates ``segment_tokens`` tokens, then splits its leaves among ``branching``
      children; a node with one leaf generates to the end of the reply. The depth is
      derived: a reply shares its first ceil(log_branching(n_samples)) - 1 segments
      (n_samples=8, branching=2: 2) with other leaves, then goes its own way.
    - ``iid``: the replies are independent samples, as flat ones, and the tree is the one
      they happen to form: one reply is generated, the others follow it token by token,
      each drawing its own token from the distribution the engine reported there (its
      ``top_logprobs`` most likely tokens), and a reply that draws another token branches
      off, generated from there. Exact when ``top_logprobs`` covers the tokens with mass
      (else a warning); ``branching`` and ``segment_tokens`` are unused.

    See docs/sampling.md."""

    enabled: bool = False  # false: the n replies of a prompt are sampled independently (flat)
    mode: str = "fixed"  # "fixed" (TreePO's segments) | "iid" (shared prefixes of iid replies)
    branching: int = 2  # fixed: children per node (the root's too: the first divergence)
    segment_tokens: int = 64  # fixed: tokens per shared segment (a node above the leaves)
    top_logprobs: int = 20  # iid: tokens per position that followers draw from

    def __post_init__(self) -> None:
        if self.mode not in ("fixed", "iid"):
            raise ConfigError(
                f"rollout.tree.mode={self.mode!r} is not a tree mode; set rollout.tree.mode="
                "fixed (TreePO's segments) or iid (shared prefixes of independent replies)"
            )
        positive("rollout.tree.segment_tokens", self.segment_tokens)
        positive("rollout.tree.top_logprobs", self.top_logprobs)
        if self.branching < 2:
            raise ConfigError(
                f"rollout.tree.branching={self.branching} must be >= 2 (a node with one child "
                "shares nothing); set rollout.tree.branching=2 or more"
            )
