"""The advantage registry: each entry turns a batch's rewards (and values) into per-token
advantages using the pure functions of ``advantages``.

Outcome estimators (grpo, dr_grpo, rloo, gpg, opo, pass_at_k, remax) give one scalar per
sequence; when the KL is a reward penalty, each token also gets the reward-to-go of the
penalty that follows it, so the penalty reaches the tokens that caused it. Token estimators
(reinforce_pp, gae) fold the penalty into their token rewards.

Traits of a registration: ``group`` (compares the samples of a prompt, so it needs
rollout.n_samples >= 2), ``needs_critic`` (starts a critic pool and reads ``values``),
``greedy_baseline`` (the controller generates one greedy reply per prompt for
``baseline_rewards``), ``pass_k`` (reads algorithm.pass_k, which must be below
rollout.n_samples), ``tree`` (reads the tree of tree rollouts, ``tree_segments``: needs
rollout.tree.enabled), ``multi_turn`` (reads the model turns of multi-turn trajectories,
``turns``: needs task.env.name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from rlsys.algorithms import advantages as A
from rlsys.registry import Registry
from rlsys.types import Turn


@dataclass
class AdvantageInputs:
    """What an estimator may use. Rows are ordered by group: ``group_size`` consecutive rows
    are the samples of one prompt."""

    rewards: np.ndarray  # (B,) outcome rewards after shaping
    mask: np.ndarray  # (B, T-1) 1 on trained response tokens
    group_size: int  # samples per prompt
    kl_penalty: np.ndarray | None = None  # (B, T-1) coef * KL per token, when a reward penalty
    values: np.ndarray | None = None  # (B, T-1) critic values (gae)
    baseline_rewards: np.ndarray | None = None  # (B,) reward of the prompt's greedy reply (remax)
    gamma: float = 1.0  # discount (gae, reinforce_pp and the KL reward-to-go)
    lam: float = 0.95  # GAE lambda
    normalize_std: bool = True  # grpo, treepo, treerl, gigpo: divide by the reward std
    pass_k: int = 4  # pass_at_k: the k of pass@k
    # (B,) tree rollouts: each row's (tree node id, tokens) segments, root's child first, in
    # the order of its trained tokens (None: flat groups; () for a row of no tree)
    tree_segments: list[tuple[tuple[int, int], ...]] | None = None
    # (B,) multi-turn trajectories: each row's model turns, start / end as (T-1) columns of
    # ``mask`` (None: single-turn rows; a None row counts as one step)
    turns: list[list[Turn] | None] | None = None
    step_weight: float = 1.0  # gigpo: weight of the step-level advantage (the paper's omega)


@dataclass
class Advantages:
    """An estimator's output: (B, T-1) advantages, and value targets for a critic."""

    advantages: np.ndarray
    returns: np.ndarray | None = None


Estimator = Callable[[AdvantageInputs], Advantages]
ADVANTAGES: Registry[Estimator] = Registry("advantage estimator", "algorithm.advantage")


def _groups(x: AdvantageInputs) -> np.ndarray:
    if len(x.rewards) % x.group_size:
        raise ValueError(
            f"{len(x.rewards)} rewards do not split into groups of rollout.n_samples="
            f"{x.group_size} samples"
        )
    return np.asarray(x.rewards, np.float64).reshape(-1, x.group_size)


def _token_rewards(x: AdvantageInputs, outcome: np.ndarray) -> np.ndarray:
    rewards = A.last_token_rewards(outcome, x.mask)
    if x.kl_penalty is not None:
        rewards = rewards - x.kl_penalty
    return rewards


def _per_token(x: AdvantageInputs, scalar: np.ndarray) -> Advantages:
    """Broadcast a per-sequence advantage over its tokens, plus the KL penalty's reward-to-go."""
    return _plus_kl_penalty(x, np.asarray(scalar, np.float64).reshape(-1, 1) * (x.mask > 0))


def _plus_kl_penalty(x: AdvantageInputs, adv: np.ndarray) -> Advantages:
    """(B, T-1) advantages plus the reward-to-go of the KL reward penalty, when there is one."""
    if x.kl_penalty is not None:
        adv = adv + A.discounted_returns(-x.kl_penalty, x.mask, x.gamma)
    return Advantages(adv.astype(np.float32))


@ADVANTAGES.register("grpo", group=True)
def grpo(x: AdvantageInputs) -> Advantages:
    return _per_token(x, A.grpo_advantages(_groups(x), normalize_std=x.normalize_std))


@ADVANTAGES.register("dr_grpo", group=True)
def dr_grpo(x: AdvantageInputs) -> Advantages:
    return _per_token(x, A.dr_grpo_advantages(_groups(x)))


@ADVANTAGES.register("rloo", group=True)
def rloo(x: AdvantageInputs) -> Advantages:
    return _per_token(x, A.rloo_advantages(_groups(x)))


@ADVANTAGES.register("gpg", group=True)
def gpg(x: AdvantageInputs) -> Advantages:
    return _per_token(x, A.gpg_advantages(_groups(x)))


@ADVANTAGES.register("opo", group=True)
def opo(x: AdvantageInputs) -> Advantages:
    lengths = (np.asarray(x.mask) > 0).sum(axis=1)
    return _per_token(x, A.opo_advantages(_groups(x), lengths.reshape(-1, x.group_size)))


@ADVANTAGES.register("pass_at_k", group=True, pass_k=True)
def pass_at_k(x: AdvantageInputs) -> Advantages:
    return _per_token(x, A.pass_at_k_advantages(_groups(x), x.pass_k))


def _tree_groups(x: AdvantageInputs) -> Iterator[tuple[int, np.ndarray, list, list]]:
    """Per group: the batch row of its first sample, its (n,) rewards, its rows' (node,
    tokens) segments and their node-id paths (both empty for rows of no tree)."""
    segments = x.tree_segments or [()] * len(x.rewards)
    n = x.group_size
    for g, rewards in enumerate(_groups(x)):
        rows = segments[g * n : (g + 1) * n]
        yield g * n, rewards, rows, [tuple(node for node, _ in row) for row in rows]


@ADVANTAGES.register("treepo", group=True, tree=True)
def treepo(x: AdvantageInputs) -> Advantages:
    """TreePO's sub-tree averaged advantages; rows without a tree path count as flat."""
    scalar = [
        A.treepo_advantages(rewards, paths, x.normalize_std)
        for _, rewards, _, paths in _tree_groups(x)
    ]
    return _per_token(x, np.concatenate(scalar))


@ADVANTAGES.register("treerl", group=True, tree=True)
def treerl(x: AdvantageInputs) -> Advantages:
    """TreeRL's segment advantages: each segment's value on the trained tokens it generated
    (a row's trained tokens in order, segment by segment); a row of no tree is one segment."""
    adv = np.zeros(np.shape(x.mask))
    for first, rewards, rows, paths in _tree_groups(x):
        values = A.treerl_advantages(rewards, paths, x.normalize_std)
        for b, row, row_values in zip(range(first, first + len(rows)), rows, values, strict=True):
            columns = np.flatnonzero(np.asarray(x.mask[b]) > 0)
            lengths = [tokens for _, tokens in row] or [len(columns)]
            ends = np.cumsum(lengths)
            for value, start, end in zip(row_values, ends - lengths, ends, strict=True):
                adv[b, columns[start:end]] = value
    return _plus_kl_penalty(x, adv)


@ADVANTAGES.register("gigpo", group=True, multi_turn=True)
def gigpo(x: AdvantageInputs) -> Advantages:
    """GiGPO: each model turn's tokens get its episode + step-level advantage; observation
    tokens (mask 0) get none; a row without turns gets its episode advantage throughout."""
    n = x.group_size
    turns = x.turns or [None] * len(x.rewards)
    adv = np.zeros(np.shape(x.mask))
    for g, rewards in enumerate(_groups(x)):
        rows = [turns[i] or [] for i in range(g * n, (g + 1) * n)]
        episode, per_turn = A.gigpo_advantages(
            rewards,
            [[t.reward for t in row] for row in rows],
            [[t.state for t in row] for row in rows],
            x.step_weight,
            x.gamma,
            x.normalize_std,
        )
        for i, (row, values) in enumerate(zip(rows, per_turn, strict=True)):
            if not row:
                adv[g * n + i] = episode[i]
            for turn, value in zip(row, values, strict=True):
                adv[g * n + i, turn.start : turn.end] = value
    return _plus_kl_penalty(x, adv * (np.asarray(x.mask) > 0))


@ADVANTAGES.register("remax", greedy_baseline=True)
def remax(x: AdvantageInputs) -> Advantages:
    if x.baseline_rewards is None:
        raise ValueError("remax needs the greedy baseline rewards (baseline_rewards)")
    return _per_token(x, A.remax_advantages(x.rewards, x.baseline_rewards))


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp(x: AdvantageInputs) -> Advantages:
    return Advantages(A.reinforce_pp_advantages(_token_rewards(x, x.rewards), x.mask, x.gamma))


@ADVANTAGES.register("reinforce_pp_baseline", group=True)
def reinforce_pp_baseline(x: AdvantageInputs) -> Advantages:
    """REINFORCE++ with baseline: the group mean reward is subtracted before the returns."""
    centred = A.dr_grpo_advantages(_groups(x)).reshape(-1)
    return Advantages(A.reinforce_pp_advantages(_token_rewards(x, centred), x.mask, x.gamma))


@ADVANTAGES.register("gae", needs_critic=True)
def gae(x: AdvantageInputs) -> Advantages:
    if x.values is None:
        raise ValueError("gae needs critic values (values)")
    adv, returns = A.gae_advantages(_token_rewards(x, x.rewards), x.values, x.mask, x.gamma, x.lam)
    return Advantages(adv, returns)
