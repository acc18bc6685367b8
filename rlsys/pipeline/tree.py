"""Tree rollouts (TreePO, Li et al. 2025, "TreePO: Bridging the Gap of Policy Optimization
and Efficacy and Inference Efficiency with Heuristic Tree-based Modeling"): a prompt's
group of n replies is grown as a tree of token segments, so replies share the tokens of
their common prefix and the engines generate those once.

Each node owes its subtree a number of leaves (its quota; the root: n). A node whose quota
is above 1 splits it as evenly as possible over ``min(branching, quota)`` children; a child
owing several leaves generates ``segment_tokens`` tokens (then splits in turn), a child
owing one generates to the end of the reply. Generation runs in rounds: one engine call
per round for every node of every prompt of the request, each child a prompt of its own
(the prompt's ids + its parent's path), so the HF engine and vLLM (whose prefix cache
keeps the shared KV) need nothing new.

A child owing several leaves that ends early (EOS, a stop, or the reply's token limit) is
one leaf; its parent re-branches for the leaves it still owes in the next round (TreePO's
fallback), so every group has exactly n leaves and no leaf is a copy of another.

Departures from the paper: branching is fixed (no probability- or quality-driven
divergence), nothing is pruned, and the segment length is one for the whole tree. Replies
that share only what independent draws would share: ``rlsys.pipeline.iid_tree``
(``rollout.tree.mode=iid``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from rlsys.config.tree import TreeConfig
from rlsys.types import Completion, RolloutGroup, SamplingParams

# (prompt ids, sampling (n=1), per-prompt budgets) -> completions per prompt; None: the run
# ends
Complete = Callable[[list[list[int]], SamplingParams, list[int]], list[list[Completion]] | None]


@dataclass
class _Node:
    """One segment of the tree (the root: the prompt, no segment)."""

    id: int  # unique within the prompt's tree (the root is 0)
    prompt: int  # index of the prompt in the request
    quota: int  # leaves this node's subtree delivers
    parent: _Node | None = None
    segment: Completion | None = None  # what this node generated (None: the root)
    path: list[_Node] = field(default_factory=list)  # root's child .. this node

    def tokens(self) -> list[int]:
        return [t for node in self.path for t in node.segment.token_ids]


def split_quota(quota: int, branching: int) -> list[int]:
    """``quota`` leaves over ``min(branching, quota)`` children, as evenly as possible
    (larger shares first)."""
    children = min(branching, quota)
    base, extra = divmod(quota, children)
    return [base + (i < extra) for i in range(children)]


def differing(versions: list[int]) -> list[int] | None:
    """``versions`` as a ``Completion.token_versions``: None when every token has the same."""
    return versions if len(set(versions)) > 1 else None


def join_segments(path: list[tuple[int, Completion]]) -> Completion:
    """One reply from its ``(node id, segment)`` path, root's child first: token ids and
    behaviour logprobs concatenated (a shared segment's are copied into every leaf below
    it), the oldest version, per-token versions only where segments differ, the last
    segment's finish reason."""
    segments = [c for _, c in path]
    versions = [v for c in segments for v in c.versions()]
    return Completion(
        token_ids=[t for c in segments for t in c.token_ids],
        logprobs=[lp for c in segments for lp in c.logprobs],
        finish_reason=segments[-1].finish_reason,
        version=min(c.version for c in segments),
        token_versions=differing(versions),
        segments=[(node_id, len(c.token_ids)) for node_id, c in path],
    )


def sample_tree(
    prompt_ids: list[list[int]],
    sampling: SamplingParams,
    tree: TreeConfig,
    complete: Complete,
) -> list[list[Completion]] | None:
    """``sampling.n`` replies per prompt grown as trees (see the module docstring), each
    reply at most ``sampling.max_new_tokens`` tokens; leaves ordered depth-first. None if
    the run ends first (``complete`` returned None)."""
    limit = sampling.max_new_tokens
    single = dataclasses.replace(sampling, n=1)
    next_id = [1] * len(prompt_ids)
    leaves: list[list[_Node]] = [[] for _ in prompt_ids]
    owed: dict[int, tuple[_Node, int]] = {}  # node -> leaves it still has to branch for
    for i in range(len(prompt_ids)):
        root = _Node(0, i, sampling.n)
        owed[id(root)] = (root, sampling.n)
    while owed:
        children = []
        for parent, quota in owed.values():
            for share in split_quota(quota, tree.branching):
                child = _Node(next_id[parent.prompt], parent.prompt, share, parent)
                child.path = [*parent.path, child]
                next_id[parent.prompt] += 1
                children.append(child)
        budgets = []
        for child in children:
            left = limit - len(child.parent.tokens())
            budgets.append(left if child.quota == 1 else min(tree.segment_tokens, left))
        out = complete(
            [prompt_ids[c.prompt] + c.parent.tokens() for c in children], single, budgets
        )
        if out is None:
            return None
        owed = {}
        for child, (segment,) in zip(children, out, strict=True):
            child.segment = segment
            ended = segment.finish_reason == "stop" or len(child.tokens()) >= limit
            if child.quota > 1 and not ended:
                owed[id(child)] = (child, child.quota)
                continue
            leaves[child.prompt].append(child)
            if child.quota > 1:  # ended early: the parent branches again for the rest
                parent, more = owed.get(id(child.parent), (child.parent, 0))
                owed[id(child.parent)] = (parent, more + child.quota - 1)
    return [
        [
            join_segments([(n.id, n.segment) for n in leaf.path])
            for leaf in sorted(group, key=lambda leaf: [n.id for n in leaf.path])
        ]
        for group in leaves
    ]


def tree_segments(groups: list[RolloutGroup]) -> list[tuple[tuple[int, int], ...]] | None:
    """(B,) the ``(tree node id, tokens)`` segments of every sample of ``groups`` (in batch
    order), root's child first; ``()`` for a sample without segments; None when no sample
    came from a tree (flat rollouts)."""
    samples = [s for g in groups for s in g.samples]
    if not any(s.completion.segments for s in samples):
        return None
    return [tuple(s.completion.segments or ()) for s in samples]


def generated_tokens(group: RolloutGroup) -> int:
    """Tokens the engines generated for ``group``: each tree node's segment once, a flat
    sample's tokens in full."""
    nodes: dict[int, int] = {}
    flat = 0
    for s in group.samples:
        if s.completion.segments is None:
            flat += len(s.completion.token_ids)
        else:
            nodes.update(s.completion.segments)
    return flat + sum(nodes.values())
