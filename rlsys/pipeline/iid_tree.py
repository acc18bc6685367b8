"""Tree rollouts of independent replies (``rollout.tree.mode=iid``): a group's n replies are
drawn exactly as flat ones would be, and the prefixes they happen to share are generated
once.

A branch is a prefix and the number of replies that go on from it. The engine generates one
of them, the lead, to its end, reporting at each position the ``top_logprobs`` most likely
tokens. Each other reply of the branch (a follower) walks along the lead, drawing its own
token at each position from that distribution: while it draws the lead's token it shares the
lead's prefix; at the first other token it branches off. Followers that branch off at the
same position onto the same token form a new branch (the lead's tokens so far and that
token) whose lead the next round generates; a follower that never branches off is a copy
of the lead (independent replies can be equal). Each reply is thus a draw from the policy,
independent of the others as in flat sampling, while the engines generate each distinct
prefix once: the tokens generated are the nodes of the trie of the n replies.

The draws are exact when the reported tokens hold all the probability mass of the
distribution the engine draws from (top-p's nucleus included); otherwise a follower draws
among the reported ones, renormalized (top-k sampling for the token it branches off onto),
and a warning says how much mass went unreported (at top_p=1). Every token keeps the
engine's behaviour logprob. One engine call per round for the open branches of every
prompt; rounds go on while branches are open (as many as the branches nest). A group's
replies are shuffled (their tree order would put the lead's copies first).

Unlike ``rlsys.pipeline.tree`` (TreePO's fixed segments, which make the replies share
prefixes they would not share if drawn alone), this changes which tokens are generated,
not what the replies are: GRPO's flat advantages apply as to flat groups.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from rlsys.pipeline.tree import Complete, differing, join_segments
from rlsys.types import Completion, SamplingParams

Path = list[tuple[int, Completion]]  # (tree node id, segment), the root's child first
# mean probability mass the engine left unreported where followers drew, above which a
# call warns (once per process): the draws are top-k sampling, not the policy's
UNREPORTED_WARN = 1e-3

log = logging.getLogger(__name__)
_warned = False


@dataclass
class _Branch:
    """Replies that share a prefix and go on from it."""

    prompt: int  # index of the prompt in the request
    path: Path  # the nodes of the prefix
    count: int  # replies going on from it
    first: tuple[int, float, int] | None = None  # (token, logprob, version) branched off onto

    def prefix(self) -> list[int]:
        shared = [t for _, c in self.path for t in c.token_ids]
        return shared if self.first is None else [*shared, self.first[0]]


def draw(top: list[tuple[int, float]], u: float) -> tuple[int, float]:
    """The (token, logprob) pair of ``top`` where ``u`` (uniform in [0, 1)) falls on the
    pairs' probabilities, renormalized to sum to 1."""
    probs = [math.exp(lp) for _, lp in top]
    target, mass = u * sum(probs), 0.0
    for pair, p in zip(top, probs, strict=True):
        mass += p
        if target < mass:
            return pair
    return top[-1]


def sample_iid_tree(
    prompt_ids: list[list[int]],
    sampling: SamplingParams,
    top_logprobs: int,
    ends: set[int],
    complete: Complete,
    uniform: Callable[[], float],
) -> list[list[Completion]] | None:
    """``sampling.n`` independent replies per prompt (see the module docstring), each at
    most ``sampling.max_new_tokens`` tokens, a reply ending at a token of ``ends`` (EOS and
    stop tokens); a group's replies shuffled. ``uniform`` draws the followers' uniforms (and
    the shuffle's keys).
    None if the run ends first (``complete`` returned None)."""
    limit = sampling.max_new_tokens
    lead = dataclasses.replace(sampling, n=1, top_logprobs=top_logprobs)
    next_id = [1] * len(prompt_ids)
    leaves: list[list[Path]] = [[] for _ in prompt_ids]

    def node(prompt: int, segment: Completion) -> tuple[int, Completion]:
        next_id[prompt] += 1
        return next_id[prompt] - 1, segment

    unreported: list[float] = []  # per follower draw: the mass outside the reported tokens
    branches = [_Branch(i, [], sampling.n) for i in range(len(prompt_ids))]
    while branches:
        calls: list[tuple[_Branch, list[int]]] = []
        for branch in branches:
            prefix = branch.prefix()
            if branch.first is not None and (branch.first[0] in ends or len(prefix) >= limit):
                token, logprob, version = branch.first  # the replies end on their own token
                reason = "stop" if token in ends else "length"
                end = node(branch.prompt, Completion([token], [logprob], reason, version))
                leaves[branch.prompt].extend([*branch.path, end] for _ in range(branch.count))
            else:
                calls.append((branch, prefix))
        if not calls:
            break
        out = complete(
            [prompt_ids[b.prompt] + prefix for b, prefix in calls],
            lead,
            [limit - len(prefix) for _, prefix in calls],
        )
        if out is None:
            return None
        branches = []
        for (branch, _), (reply,) in zip(calls, out, strict=True):
            follow = _follow(branch, reply, uniform, node, leaves[branch.prompt], unreported)
            branches.extend(follow)
    if sampling.top_p >= 1.0:  # under top-p the HF engine reports unrenormalized logprobs
        _warn_unreported(unreported, top_logprobs)
    return [
        [join_segments(path) for path in sorted(group, key=lambda _: uniform())] for group in leaves
    ]


def _warn_unreported(unreported: list[float], top_logprobs: int) -> None:
    global _warned
    mean = sum(unreported) / len(unreported) if unreported else 0.0
    if mean > UNREPORTED_WARN and not _warned:
        _warned = True
        log.warning(
            "rollout.tree.mode=iid: the %d most likely tokens left %.4f of the probability "
            "mass unreported on average where replies drew their tokens, so those draws are "
            "top-%d sampling, not the policy's; raise rollout.tree.top_logprobs",
            top_logprobs,
            mean,
            top_logprobs,
        )


def _follow(
    branch: _Branch,
    reply: Completion,
    uniform: Callable[[], float],
    node: Callable[[int, Completion], tuple[int, Completion]],
    leaves: list[Path],
    unreported: list[float],
) -> list[_Branch]:
    """Walk ``branch``'s followers along its lead ``reply``: the lead's nodes (cut where
    followers branch off) and its copies go to ``leaves``, the mass left unreported at each
    draw to ``unreported``; returns the new branches."""
    if reply.top_logprobs is None and reply.token_ids:
        raise RuntimeError(
            "rollout.tree.mode=iid needs the engine to report each position's most likely "
            "tokens (SamplingParams.top_logprobs), and this engine returned none; set "
            "rollout.tree.mode=fixed or rollout.engine=hf|vllm"
        )
    segment, top = reply, list(reply.top_logprobs or [])
    if branch.first is not None:  # the branch's own first token opens the lead's segment
        segment, top = _prepend(branch.first, reply), [[], *top]
    tokens = segment.token_ids
    if not tokens:  # an engine that generated nothing: the replies end here, empty
        leaves.extend([*branch.path, node(branch.prompt, segment)] for _ in range(branch.count))
        return []
    start = 0 if branch.first is None else 1  # every reply of the branch shares that token
    missing = [max(0.0, 1.0 - sum(math.exp(lp) for _, lp in t)) for t in top]  # per position
    off: dict[tuple[int, int], list] = {}  # (position, token) -> [logprob, followers]
    copies = 1
    for _ in range(branch.count - 1):
        for j in range(start, len(tokens)):
            token, logprob = draw(top[j], uniform())
            unreported.append(missing[j])
            if token != tokens[j]:
                off.setdefault((j, token), [logprob, 0])[1] += 1
                break
        else:
            copies += 1
    cuts = sorted({0, len(tokens), *(j for j, _ in off)})
    pieces = [
        (b, node(branch.prompt, _slice(segment, a, b)))
        for a, b in zip(cuts, cuts[1:], strict=False)
    ]
    path = [*branch.path, *(n for _, n in pieces)]
    leaves.extend(list(path) for _ in range(copies))
    versions = segment.versions()
    return [
        _Branch(
            branch.prompt,
            [*branch.path, *(n for b, n in pieces if b <= j)],
            count,
            (token, logprob, versions[j]),
        )
        for (j, token), (logprob, count) in sorted(off.items())
    ]


def _prepend(first: tuple[int, float, int], reply: Completion) -> Completion:
    token, logprob, version = first
    versions = [version, *reply.versions()]
    return Completion(
        [token, *reply.token_ids],
        [logprob, *reply.logprobs],
        reply.finish_reason,
        min(versions),
        token_versions=differing(versions),
    )


def _slice(segment: Completion, a: int, b: int) -> Completion:
    """Tokens ``a:b`` of ``segment``: the end's finish reason only at the end."""
    versions = segment.versions()[a:b]
    return Completion(
        segment.token_ids[a:b],
        segment.logprobs[a:b],
        segment.finish_reason if b == len(segment.token_ids) else "length",
        min(versions),
        token_versions=differing(versions),
    )
