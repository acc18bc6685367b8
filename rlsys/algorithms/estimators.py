"""The advantage registry: each entry turns a batch's rewards (and values) into per-token
advantages using the pure functions of ``advantages``.

A registered estimator is ``(AdvantageInputs, settings) -> Advantages``: the inputs are the
batch's arrays only, the settings a frozen dataclass of that estimator's own knobs
(``rlsys.algorithms.settings``), built once per run from the flat ``algorithm.*`` keys the
presets use (gamma, lam, normalize_std, pass_k, gigpo_step_weight) and from
``algorithm.advantage_args`` (``advantage_settings``).

Outcome estimators (grpo, dr_grpo, rloo, gpg, opo, pass_at_k, remax) give one scalar per
sequence; when the KL is a reward penalty, each token also gets the reward-to-go of the
penalty that follows it (discounted by the settings' ``gamma``), so the penalty reaches the
tokens that caused it. Token estimators (reinforce_pp, gae) fold the penalty into their token
rewards.

Traits of a registration: ``group`` (compares the samples of a prompt, so it needs
rollout.n_samples >= 2), ``needs_critic`` (starts a critic pool and reads ``values``),
``greedy_baseline`` (the controller generates one greedy reply per prompt for
``baseline_rewards``), ``pass_k`` (its settings' ``k`` must be below rollout.n_samples),
``tree`` (reads the tree of tree rollouts, ``tree_segments``: needs rollout.tree.enabled),
``multi_turn`` (reads the model turns of multi-turn trajectories, ``turns``: needs
task.env.name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlsys.algorithms import advantages as A
from rlsys.algorithms.settings import NoSettings, build_settings, setting
from rlsys.config.checks import non_negative
from rlsys.config.errors import ConfigError
from rlsys.registry import Registry
from rlsys.types import Turn

if TYPE_CHECKING:
    from rlsys.config.algorithm import AlgorithmConfig


@dataclass
class AdvantageInputs:
    """The arrays of a batch an estimator reads. Rows are ordered by group: ``group_size``
    consecutive rows are the samples of one prompt."""

    rewards: np.ndarray  # (B,) outcome rewards after shaping
    mask: np.ndarray  # (B, T-1) 1 on trained response tokens
    group_size: int  # samples per prompt (the layout of the rows, rollout.n_samples)
    kl_penalty: np.ndarray | None = None  # (B, T-1) coef * KL per token, when a reward penalty
    values: np.ndarray | None = None  # (B, T-1) critic values (gae)
    baseline_rewards: np.ndarray | None = None  # (B,) reward of the prompt's greedy reply (remax)
    # (B,) tree rollouts: each row's (tree node id, tokens) segments, root's child first, in
    # the order of its trained tokens (None: flat groups; () for a row of no tree)
    tree_segments: list[tuple[tuple[int, int], ...]] | None = None
    # (B,) multi-turn trajectories: each row's model turns, start / end as (T-1) columns of
    # ``mask`` (None: single-turn rows; a None row counts as one step)
    turns: list[list[Turn] | None] | None = None


@dataclass
class Advantages:
    """An estimator's output: (B, T-1) advantages, and value targets for a critic."""

    advantages: np.ndarray
    returns: np.ndarray | None = None


Estimator = Callable[[AdvantageInputs, Any], Advantages]
ADVANTAGES: Registry[Estimator] = Registry("advantage estimator", "algorithm.advantage")


def advantage_settings(algo: AlgorithmConfig) -> Any:
    """The settings of ``algo.advantage``, from the flat keys and ``advantage_args``; raises
    ConfigError naming a bad one."""
    cls = ADVANTAGES.settings(algo.advantage) or NoSettings
    return build_settings(
        cls,
        algo,
        dict(algo.advantage_args),
        "algorithm.advantage_args",
        f"algorithm.advantage={algo.advantage}",
    )


# ---- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DiscountSettings:
    """The discount of returns over tokens (reinforce_pp's returns; for an outcome estimator,
    the KL reward penalty's reward-to-go)."""

    gamma: float = setting(1.0, "gamma")

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"{_ARGS}gamma={self.gamma} must be in (0, 1] (1.0 is usual)")


@dataclass(frozen=True)
class GroupNormSettings(DiscountSettings):
    """A group-relative advantage divided by the (sub- or step) group's reward std, or not
    (``normalize_std=False``: Dr.GRPO's centring)."""

    normalize_std: bool = setting(True, "normalize_std")


@dataclass(frozen=True)
class GpgSettings(DiscountSettings):
    """GPG's batch scale alpha: ``paper`` (B / (B - samples in tied groups), Chu et al. 2025)
    or ``verl`` (B / non-zero rewards, a group of one centred on 0: verl's form, for parity
    with runs made there). ``advantages.gpg_advantages`` has both formulas."""

    batch_scale: str = setting("paper")  # set through algorithm.advantage_args.batch_scale

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_scale not in A.GPG_BATCH_SCALES:
            raise ConfigError(
                f"{_ARGS}batch_scale={self.batch_scale!r} is not one of {A.GPG_BATCH_SCALES}: "
                "paper is the GPG paper's alpha (the default), verl is verl's"
            )


@dataclass(frozen=True)
class PassAtKSettings(DiscountSettings):
    """pass@k's k (1 <= k < rollout.n_samples; 1 is GRPO with the population std)."""

    k: int = setting(4, "pass_k")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k < 1:
            raise ConfigError(f"{_ARGS}k={self.k} must be >= 1 (the k of pass@k)")


@dataclass(frozen=True)
class GigpoSettings(GroupNormSettings):
    """GiGPO: ``gamma`` discounts the step returns over turns, ``step_weight`` (the paper's
    omega) weighs the step-level advantage added to the episode-level one."""

    step_weight: float = setting(1.0, "gigpo_step_weight")

    def __post_init__(self) -> None:
        super().__post_init__()
        non_negative(_ARGS + "step_weight", self.step_weight)


@dataclass(frozen=True)
class GaeSettings(DiscountSettings):
    """GAE's discount and lambda (the bias-variance trade-off of the critic's advantages)."""

    lam: float = setting(0.95, "lam")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.lam <= 1:
            raise ConfigError(f"{_ARGS}lam={self.lam} must be in [0, 1] (0.95 is usual)")


# Values from the flat keys were checked with the config (naming those keys): a failure here
# comes from algorithm.advantage_args.
_ARGS = "algorithm.advantage_args."


# ---- the estimators ------------------------------------------------------------------------


def _groups(x: AdvantageInputs) -> np.ndarray:
    if len(x.rewards) % x.group_size:
        raise ValueError(
            f"{len(x.rewards)} rewards do not split into groups of rollout.n_samples="
            f"{x.group_size} samples"
        )
    return np.asarray(x.rewards, np.float64).reshape(-1, x.group_size)


def _token_rewards(x: AdvantageInputs, outcome: np.ndarray) -> np.ndarray:
    """(B, T-1) rewards: ``outcome`` on each row's last trained token, minus the KL penalty."""
    rewards = A.last_token_rewards(outcome, x.mask)
    if x.kl_penalty is not None:
        rewards = rewards - x.kl_penalty
    return rewards


def _per_token(x: AdvantageInputs, scalar: np.ndarray, gamma: float) -> Advantages:
    """Broadcast a per-sequence advantage over its tokens, plus the KL penalty's reward-to-go
    discounted by ``gamma``."""
    adv = np.asarray(scalar, np.float64).reshape(-1, 1) * (x.mask > 0)
    return _plus_kl_penalty(x, adv, gamma)


def _plus_kl_penalty(x: AdvantageInputs, adv: np.ndarray, gamma: float) -> Advantages:
    """(B, T-1) advantages plus the reward-to-go of the KL reward penalty, when there is one."""
    if x.kl_penalty is not None:
        adv = adv + A.discounted_returns(-x.kl_penalty, x.mask, gamma)
    return Advantages(adv.astype(np.float32))


@ADVANTAGES.register("grpo", settings=GroupNormSettings, group=True)
def grpo(x: AdvantageInputs, s: GroupNormSettings) -> Advantages:
    return _per_token(x, A.grpo_advantages(_groups(x), s.normalize_std), s.gamma)


@ADVANTAGES.register("dr_grpo", settings=DiscountSettings, group=True)
def dr_grpo(x: AdvantageInputs, s: DiscountSettings) -> Advantages:
    return _per_token(x, A.dr_grpo_advantages(_groups(x)), s.gamma)


@ADVANTAGES.register("rloo", settings=DiscountSettings, group=True)
def rloo(x: AdvantageInputs, s: DiscountSettings) -> Advantages:
    return _per_token(x, A.rloo_advantages(_groups(x)), s.gamma)


@ADVANTAGES.register("gpg", settings=GpgSettings, group=True)
def gpg(x: AdvantageInputs, s: GpgSettings) -> Advantages:
    return _per_token(x, A.gpg_advantages(_groups(x), s.batch_scale), s.gamma)


@ADVANTAGES.register("opo", settings=DiscountSettings, group=True)
def opo(x: AdvantageInputs, s: DiscountSettings) -> Advantages:
    lengths = (np.asarray(x.mask) > 0).sum(axis=1)
    scalar = A.opo_advantages(_groups(x), lengths.reshape(-1, x.group_size))
    return _per_token(x, scalar, s.gamma)


@ADVANTAGES.register("pass_at_k", settings=PassAtKSettings, group=True, pass_k=True)
def pass_at_k(x: AdvantageInputs, s: PassAtKSettings) -> Advantages:
    return _per_token(x, A.pass_at_k_advantages(_groups(x), s.k), s.gamma)


def _tree_groups(x: AdvantageInputs) -> Iterator[tuple[int, np.ndarray, list, list]]:
    """Per group: the batch row of its first sample, its (n,) rewards, its rows' (node,
    tokens) segments and their node-id paths (both empty for rows of no tree)."""
    segments = x.tree_segments or [()] * len(x.rewards)
    n = x.group_size
    for g, rewards in enumerate(_groups(x)):
        rows = segments[g * n : (g + 1) * n]
        yield g * n, rewards, rows, [tuple(node for node, _ in row) for row in rows]


@ADVANTAGES.register("treepo", settings=GroupNormSettings, group=True, tree=True)
def treepo(x: AdvantageInputs, s: GroupNormSettings) -> Advantages:
    """TreePO's sub-tree averaged advantages; rows without a tree path count as flat."""
    scalar = [
        A.treepo_advantages(rewards, paths, s.normalize_std)
        for _, rewards, _, paths in _tree_groups(x)
    ]
    return _per_token(x, np.concatenate(scalar), s.gamma)


@ADVANTAGES.register("treerl", settings=GroupNormSettings, group=True, tree=True)
def treerl(x: AdvantageInputs, s: GroupNormSettings) -> Advantages:
    """TreeRL's segment advantages: each segment's value on the trained tokens it generated
    (a row's trained tokens in order, segment by segment); a row of no tree is one segment."""
    adv = np.zeros(np.shape(x.mask))
    for first, rewards, rows, paths in _tree_groups(x):
        values = A.treerl_advantages(rewards, paths, s.normalize_std)
        for b, row, row_values in zip(range(first, first + len(rows)), rows, values, strict=True):
            columns = np.flatnonzero(np.asarray(x.mask[b]) > 0)
            lengths = [tokens for _, tokens in row] or [len(columns)]
            ends = np.cumsum(lengths)
            for value, start, end in zip(row_values, ends - lengths, ends, strict=True):
                adv[b, columns[start:end]] = value
    return _plus_kl_penalty(x, adv, s.gamma)


@ADVANTAGES.register("gigpo", settings=GigpoSettings, group=True, multi_turn=True)
def gigpo(x: AdvantageInputs, s: GigpoSettings) -> Advantages:
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
            s.step_weight,
            s.gamma,
            s.normalize_std,
        )
        for i, (row, values) in enumerate(zip(rows, per_turn, strict=True)):
            if not row:
                adv[g * n + i] = episode[i]
            for turn, value in zip(row, values, strict=True):
                adv[g * n + i, turn.start : turn.end] = value
    return _plus_kl_penalty(x, adv * (np.asarray(x.mask) > 0), s.gamma)


@ADVANTAGES.register("remax", settings=DiscountSettings, greedy_baseline=True)
def remax(x: AdvantageInputs, s: DiscountSettings) -> Advantages:
    if x.baseline_rewards is None:
        raise ValueError("remax needs the greedy baseline rewards (baseline_rewards)")
    return _per_token(x, A.remax_advantages(x.rewards, x.baseline_rewards), s.gamma)


@ADVANTAGES.register("reinforce_pp", settings=DiscountSettings)
def reinforce_pp(x: AdvantageInputs, s: DiscountSettings) -> Advantages:
    return Advantages(A.reinforce_pp_advantages(_token_rewards(x, x.rewards), x.mask, s.gamma))


@ADVANTAGES.register("reinforce_pp_baseline", settings=DiscountSettings, group=True)
def reinforce_pp_baseline(x: AdvantageInputs, s: DiscountSettings) -> Advantages:
    """REINFORCE++ with baseline: the group mean reward is subtracted before the returns."""
    centred = A.dr_grpo_advantages(_groups(x)).reshape(-1)
    return Advantages(A.reinforce_pp_advantages(_token_rewards(x, centred), x.mask, s.gamma))


@ADVANTAGES.register("gae", settings=GaeSettings, needs_critic=True)
def gae(x: AdvantageInputs, s: GaeSettings) -> Advantages:
    if x.values is None:
        raise ValueError("gae needs critic values (values)")
    rewards = _token_rewards(x, x.rewards)
    adv, returns = A.gae_advantages(rewards, x.values, x.mask, s.gamma, s.lam)
    return Advantages(adv, returns)
