"""Advantage estimators: pure numpy functions from rewards (and values) to advantages.

Conventions: ``(G, n)`` arrays hold one row per prompt group of ``n`` samples; ``(B, T-1)``
per-token arrays follow ``rlsys.types`` (entry t scores token t+1) with ``mask`` 1 on trained
response tokens. Positions with mask 0 inside a response (environment or tool tokens) are
skipped by the token-level recursions: the next action token's value and advantage carry
across them, and they get advantage 0. Outputs are float32.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np


def grpo_advantages(
    rewards: np.ndarray, normalize_std: bool = True, eps: float = 1e-6
) -> np.ndarray:
    """Group-relative advantages of GRPO (Shao et al. 2024, DeepSeekMath, eq. 3).

    rewards: (G, n) outcome rewards, one row per prompt group. Returns (G, n):
    ``(r - mean_group(r)) / (std_group(r) + eps)``, the same value for every token of a
    response (outcome supervision).

    Departures: ``normalize_std=False`` drops the std division (the Dr.GRPO fix for the
    difficulty bias); std is the unbiased sample std, as in the paper's reference code; a
    group of one sample gets advantage 0, and so does a tied group exactly (its mean can
    round away from the rewards, e.g. three 0.1s, which the std's eps would then amplify).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    centred = rewards - rewards.mean(axis=1, keepdims=True)
    centred[rewards.max(axis=1) == rewards.min(axis=1)] = 0.0
    if not normalize_std:
        return centred.astype(np.float32)
    n = rewards.shape[1]
    std = rewards.std(axis=1, ddof=1, keepdims=True) if n > 1 else np.ones_like(centred[:, :1])
    return (centred / (std + eps)).astype(np.float32)


def treepo_advantages(
    rewards: np.ndarray,
    paths: list[tuple[int, ...]],
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """Tree advantages of TreePO (Li et al. 2025, "TreePO: Bridging the Gap of Policy
    Optimization and Efficacy and Inference Efficiency with Heuristic Tree-based Modeling",
    fig. 3, as read here): each subtree of a group's tree is a sub-group, and a leaf's advantage
    is the plain average of its group-relative advantages in every sub-group it belongs to.

    rewards: (n,) the outcome rewards of one group's leaves; paths[i]: the tree node ids
    from the root's child down to leaf i. The sub-groups are the whole group (the root)
    and, for every node, the leaves below it, kept when they number 2 or more. In sub-group
    S a leaf gets GRPO's ``(r_i - mean_S(r)) / (std_S(r) + eps)``, and
    ``A_i = mean over the S that hold i``. Returns (n,), the same value for every token of a
    leaf's reply. With no shared node (a flat group) this is ``grpo_advantages``.

    Departures: std is the unbiased sample std as in ``grpo_advantages``, and
    ``normalize_std=False`` drops it (Dr.GRPO's centring, per sub-group); a sub-group whose
    rewards all tie gives its leaves 0 and still counts in the average (it says the
    branch point made no difference); sub-groups are not weighted by size or depth, and
    the average is not re-normalised over the group.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    members: dict[int, list[int]] = {}
    for leaf, path in enumerate(paths):
        for node in path:
            members.setdefault(node, []).append(leaf)
    groups = [list(range(len(rewards)))] + [m for m in members.values() if len(m) > 1]
    total = np.zeros(len(rewards))
    count = np.zeros(len(rewards))
    for group in groups:
        adv = grpo_advantages(rewards[group][None, :], normalize_std, eps)[0]
        total[group] += adv
        count[group] += 1
    return (total / count).astype(np.float32)


def treerl_advantages(
    rewards: np.ndarray,
    paths: list[tuple[int, ...]],
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """Segment advantages of TreeRL (Hou et al. 2025, "TreeRL: LLM Reinforcement Learning
    with On-Policy Tree Search", sec. 3.2, as read here): every segment of a tree gets its
    own advantage from the leaves below it, so a shared segment is credited with what the
    replies through it scored and a reply's own segment with its own reward, each against
    the whole group and against the leaves below its parent.

    rewards: (n,) the outcome rewards of one group's leaves; paths[i]: the tree node ids
    from the root's child down to leaf i (a leaf's own segment last). ``V(v)`` is the mean
    reward of the leaves below node v (the root: the whole group), ``L(v)`` their number;
    segment v with parent p gets ``(V(v) - V(root) + V(v) - V(p)) / (2 sqrt(L(v)))``, the
    paper's global plus local advantage over the square root of the leaves that share it.
    Returns, for each leaf, the advantage of each segment of its path, in path order.

    Departures: the halving (so that a flat group, every path one leaf's own node, gives
    ``r - mean``, Dr.GRPO's centring); ``normalize_std=True`` divides by the group's
    unbiased reward std as ``grpo_advantages`` does (the paper's rewards are 0/1 and not
    scaled), so a flat group gives GRPO's advantage; a leaf with an empty path is its own
    one-leaf segment under the root.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    paths = [path or (-1 - leaf,) for leaf, path in enumerate(paths)]
    below: dict[int, list[int]] = {}
    for leaf, path in enumerate(paths):
        for node in path:
            below.setdefault(node, []).append(leaf)
    value = {node: float(rewards[leaves].mean()) for node, leaves in below.items()}
    root = float(rewards.mean())
    scale = 1.0
    if normalize_std:
        std = float(rewards.std(ddof=1)) if len(rewards) > 1 else 1.0
        scale = 1.0 / (std + eps)
    out = []
    for path in paths:
        parents = [root] + [value[node] for node in path[:-1]]
        out.append(
            np.array(
                [
                    (2 * value[node] - root - parent) / (2 * math.sqrt(len(below[node]))) * scale
                    for node, parent in zip(path, parents, strict=True)
                ],
                dtype=np.float32,
            )
        )
    return out


def gigpo_advantages(
    rewards: np.ndarray,
    turn_rewards: list[list[float]],
    states: list[list[str]],
    step_weight: float = 1.0,
    gamma: float = 1.0,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Group-in-group advantages of GiGPO (Feng et al. 2025, "Group-in-Group Policy
    Optimization for LLM Agent Training", sec. 4): an episode-level advantage over the
    trajectories of a prompt plus a step-level one within each group of turns that acted on
    the same state ("anchor state") anywhere in those trajectories.

    rewards: (n,) the episode returns of one group's trajectories; turn_rewards[i][k] and
    states[i][k]: the reward of turn k of trajectory i and the key of the state it acted on.
    Episode level: ``A^E = grpo_advantages(rewards)``. Step level: turn k's return is
    ``R_ik = sum_{j >= k} gamma^(j - k) r_ij``; the turns with equal keys form a step group
    (a trajectory may add several), and in it ``A^S = (R - mean(R)) / (std(R) + eps)``. Turn
    k of trajectory i gets ``A^E_i + step_weight * A^S_ik``. Returns (A^E as (n,), and for
    each trajectory its (K_i,) turn advantages).

    Departures: the part of ``rewards[i]`` that no turn reported (a reward function on the
    whole transcript, overlong shaping) counts as the last turn's reward, so with gamma 1 the
    first turn's return is the episode return; states are keyed by the environment's
    ``state_key()`` or by a digest of the observations so far (``rlsys.envs.rollout``), not by
    the paper's environment state; the std (both levels) is the unbiased sample std as in
    ``grpo_advantages`` and ``normalize_std=False`` drops it (the paper's F_norm = 1); a step
    group of one turn (a state seen once) or of tied returns gives A^S = 0. The paper's
    omega = 1 and gamma = 0.95 are the preset's (``conf/algorithm/gigpo.yaml``).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    if len(turn_rewards) != len(rewards):
        raise ValueError(f"{len(rewards)} episode rewards but {len(turn_rewards)} trajectories")
    episode = grpo_advantages(rewards[None, :], normalize_std, eps)[0].astype(np.float64)
    returns: list[np.ndarray] = []
    members: dict[str, list[tuple[int, int]]] = {}
    for i, (own, keys) in enumerate(zip(turn_rewards, states, strict=True)):
        if len(own) != len(keys):
            raise ValueError(f"trajectory {i}: {len(own)} turn rewards but {len(keys)} states")
        step = np.array(own, dtype=np.float64)
        if len(step):
            step[-1] += rewards[i] - step.sum()
        out, running = np.zeros(len(step)), 0.0
        for k in range(len(step) - 1, -1, -1):
            running = step[k] + gamma * running
            out[k] = running
        returns.append(out)
        for k, key in enumerate(keys):
            members.setdefault(key, []).append((i, k))
    step_adv = [np.zeros(len(r)) for r in returns]
    for group in members.values():
        if len(group) > 1:
            values = np.array([[returns[i][k] for i, k in group]])
            relative = grpo_advantages(values, normalize_std, eps)[0]
            for (i, k), a in zip(group, relative, strict=True):
                step_adv[i][k] = a
    turns = [(episode[i] + step_weight * a).astype(np.float32) for i, a in enumerate(step_adv)]
    return episode.astype(np.float32), turns


def dr_grpo_advantages(rewards: np.ndarray) -> np.ndarray:
    """Dr.GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.2).

    ``r - mean_group(r)``: GRPO without the std division, which up-weights groups that are
    almost all right or all wrong. The paper's other fix (no 1/|o| length normaliser) is the
    loss aggregation ``seq_sum_norm`` (see ``losses.loss_weights``). rewards: (G, n).
    """
    return grpo_advantages(rewards, normalize_std=False)


def rloo_advantages(rewards: np.ndarray) -> np.ndarray:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

    Each sample's baseline is the mean reward of the other n-1 samples of its group:
    ``r_i - mean_{j != i} r_j = n / (n - 1) * (r_i - mean(r))``. rewards: (G, n), n >= 2.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    if n < 2:
        raise ValueError(
            f"RLOO needs at least 2 samples per group, got {n}: raise rollout.n_samples"
        )
    others = (rewards.sum(axis=1, keepdims=True) - rewards) / (n - 1)
    return (rewards - others).astype(np.float32)


# algorithm.advantage_args.batch_scale of gpg: the paper's alpha, or verl's
GPG_BATCH_SCALES = ("paper", "verl")


def gpg_advantages(
    rewards: np.ndarray, batch_scale: str = "paper", groups: np.ndarray | None = None
) -> np.ndarray:
    """Group Policy Gradient (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement
    Learning Baseline for Model Reasoning"): group-centred rewards scaled by the paper's
    gradient correction.

    ``alpha * (r - mean_group(r))`` with ``alpha = B / (B - M)``: B samples in the batch, M of
    them in groups whose rewards all tie (advantage exactly 0). Those samples still count in
    the token-mean normaliser of the loss, so without alpha the gradient of the informative
    groups would shrink by (B - M) / B; alpha undoes that without dropping the groups. With
    ``filter_uniform_groups`` on, M = 0 and this is Dr.GRPO's advantage. rewards: (G, n) of
    the whole batch (alpha is a batch statistic), or (B,) with ``groups`` (B,) each sample's
    group id, for groups of unequal size (verl's layout; the estimator passes (G, n)). Every
    group uniform gives all zeros; a group of one ties with itself (M counts it, advantage 0).

    ``batch_scale="verl"`` is verl's form (``compute_gpg_outcome_advantage``, 0.9):
    ``alpha = B / max(1, number of non-zero rewards)``, and a group of one is centred on 0,
    not on its own reward (its advantage is ``alpha * r``). With 0/1 rewards verl's
    denominator counts the correct samples, the paper's the samples of groups with both
    outcomes, so the scales differ on almost every batch.

    Departures: the paper's optional division by the group's reward std (its F_norm = std)
    is left out, F_norm = 1 always (``grpo`` is the std-normalised form); a tie is exact
    equality of the rewards the estimator sees (after overlong shaping; under ``verl`` too,
    where verl's counted scores also hold a KL reward penalty); a tied group of two or more
    gets exactly 0 (floats' mean of equal values may differ in the last bit).
    """
    if batch_scale not in GPG_BATCH_SCALES:
        raise ValueError(
            f"algorithm.advantage_args.batch_scale={batch_scale!r} is not one of "
            f"{GPG_BATCH_SCALES}; set paper (the default) or verl"
        )
    rewards = np.asarray(rewards, dtype=np.float64)
    flat = rewards.reshape(-1)
    if groups is None:
        ids = np.repeat(np.arange(rewards.shape[0]), rewards.shape[1])
    elif np.shape(groups) != flat.shape:
        raise ValueError(f"{np.shape(groups)} group ids for {flat.shape} rewards; give one each")
    else:
        ids = np.unique(np.asarray(groups), return_inverse=True)[1].reshape(-1)
    count = np.bincount(ids)
    mean = np.bincount(ids, flat) / count
    high, low = np.full(len(count), -np.inf), np.full(len(count), np.inf)
    np.maximum.at(high, ids, flat)
    np.minimum.at(low, ids, flat)
    tied = high == low
    if batch_scale == "verl":
        mean[count == 1] = 0.0
        tied &= count > 1
        alpha = flat.size / max(1, int(np.count_nonzero(flat)))
    else:
        informative = flat.size - int(count[tied].sum())
        alpha = flat.size / informative if informative else 1.0
    centred = np.where(tied[ids], 0.0, flat - mean[ids])
    return (alpha * centred).reshape(rewards.shape).astype(np.float32)


def opo_advantages(rewards: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, "On-Policy RL with Optimal
    Reward Baseline"): the reward minus the group's length-weighted mean reward.

    ``r_i - b`` with ``b = sum_j L_j r_j / sum_j L_j`` over the group, L_j the number of
    trained tokens of sample j. The variance-minimising baseline of a policy gradient is
    ``E[|grad log pi(o)|^2 r] / E[|grad log pi(o)|^2]``; the paper takes the squared gradient
    norm of a sequence to grow in proportion to its length, which gives b. rewards and
    lengths: (G, n).

    Departures: L counts trained tokens (loss mask 1), so tool or environment tokens and
    samples whose loss is masked out (``overlong_filter``) weigh less or nothing in the
    baseline, as they add nothing to the gradient; a group with no trained token at all
    falls back to the plain mean (its advantages then reach no token).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    lengths = np.asarray(lengths, dtype=np.float64)
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths {lengths.shape} do not match rewards {rewards.shape}")
    total = lengths.sum(axis=1, keepdims=True)
    weighted = (lengths * rewards).sum(axis=1, keepdims=True) / np.where(total > 0, total, 1.0)
    baseline = np.where(total > 0, weighted, rewards.mean(axis=1, keepdims=True))
    return (rewards - baseline).astype(np.float32)


PASS_THRESHOLD = 0.5  # pass_at_k: a reward above this counts as a correct sample


def pass_at_k_advantages(
    rewards: np.ndarray, k: int, threshold: float = PASS_THRESHOLD
) -> np.ndarray:
    """Pass@k training, analytic advantages (Chen et al. 2025, "Pass@k Training for
    Adaptively Balancing Exploration and Exploitation of Large Reasoning Models").

    In a group of N samples, N_neg of them incorrect, the expected pass@k of a random k-subset
    is ``R = 1 - C(N_neg, k) / C(N, k)`` and ``sigma = sqrt(R (1 - R))``; a correct sample
    gets ``(1 - R) / sigma``, an incorrect one ``(1 - R - C(N_neg - 1, k - 1) / C(N - 1,
    k - 1)) / sigma``, the ratio being the chance that a k-subset holding it fails: each is
    the mean of ``(pass(S) - R) / sigma`` over the k-subsets S that hold the sample. Groups
    with sigma = 0 get 0: all correct, all incorrect, and N_neg < k (every k-subset passes).
    With k = 1 this is ``(r - mean) / std`` with the population std: GRPO on binary rewards.
    The advantages of a group sum to zero. rewards: (G, n); 1 <= k < n (k = n: no signal).

    Departures: the paper's rewards are binary; here a sample is correct when its reward is
    above ``threshold`` (0.5: exact for 0/1 rewards; partial credit above one half counts as
    a pass, at or below as a failure, so the scale of the credit is lost, and an overlong
    penalty can turn a correct reply into a failure). Counts are combined exactly (integer
    binomials, rationals) so a nearly-always-passing group keeps a finite advantage.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.shape[1]
    if not 1 <= k < n:
        raise ValueError(
            f"pass@k needs 1 <= k < group size: algorithm.pass_k={k}, rollout.n_samples={n}"
        )
    correct = rewards > threshold
    out = np.zeros(rewards.shape, dtype=np.float64)
    for g, row in enumerate(correct):
        neg = n - int(row.sum())
        fail = Fraction(math.comb(neg, k), math.comb(n, k))  # 1 - R: every one of k fails
        if fail in (0, 1):  # R = 1 or 0: sigma = 0, and so are the numerators
            continue
        sigma = math.sqrt(fail * (1 - fail))
        with_neg = Fraction(math.comb(neg - 1, k - 1), math.comb(n - 1, k - 1))
        out[g] = np.where(row, float(fail) / sigma, float(fail - with_neg) / sigma)
    return out.astype(np.float32)


def remax_advantages(rewards: np.ndarray, greedy_rewards: np.ndarray) -> np.ndarray:
    """ReMax (Li et al. 2024): the reward minus the reward of the greedy response to the same
    prompt, a baseline that costs one extra (greedy) generation per prompt and no critic.
    Both (B,) or broadcastable."""
    return (np.asarray(rewards, np.float64) - np.asarray(greedy_rewards, np.float64)).astype(
        np.float32
    )


def last_token_rewards(rewards: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B, T-1) token rewards: each sequence's outcome reward on its last trained token."""
    mask = np.asarray(mask)
    out = np.zeros(mask.shape, dtype=np.float64)
    has_tokens = mask.any(axis=1)
    last = mask.shape[1] - 1 - np.argmax(mask[:, ::-1] > 0, axis=1)
    rows = np.nonzero(has_tokens)[0]
    out[rows, last[rows]] = np.asarray(rewards, np.float64)[rows]
    return out


def discounted_returns(token_rewards: np.ndarray, mask: np.ndarray, gamma: float) -> np.ndarray:
    """Reward-to-go ``G_t = r_t + gamma * G_{t'}`` over trained tokens, t' the next trained
    token (masked positions are skipped and get 0). Shapes (B, T-1)."""
    rewards = np.asarray(token_rewards, np.float64)
    mask = np.asarray(mask) > 0
    out = np.zeros(rewards.shape, dtype=np.float64)
    running = np.zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = np.where(mask[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = np.where(mask[:, t], running, 0.0)
    return out.astype(np.float32)


def whiten(values: np.ndarray, mask: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """``(x - mean) / (std + eps)`` over the masked entries of the whole batch; masked-out
    entries become 0. The std is the population std (ddof 0)."""
    values = np.asarray(values, np.float64)
    keep = np.asarray(mask) > 0
    if not keep.any():
        return np.zeros(values.shape, np.float32)
    selected = values[keep]
    out = (values - selected.mean()) / (selected.std() + eps)
    return np.where(keep, out, 0.0).astype(np.float32)


def reinforce_pp_advantages(
    token_rewards: np.ndarray, mask: np.ndarray, gamma: float = 1.0
) -> np.ndarray:
    """REINFORCE++ (Hu 2025, "REINFORCE++: a simple and efficient approach"): discounted
    returns of the token rewards (outcome reward on the last token, minus the per-token KL
    penalty when the KL is a reward), whitened over every trained token of the batch.

    For REINFORCE++ with baseline the caller first subtracts each group's mean reward from
    the outcome rewards (see ``estimators``); the batch whitening is the same.
    """
    return whiten(discounted_returns(token_rewards, mask, gamma), mask)


def gae_advantages(
    token_rewards: np.ndarray,
    values: np.ndarray,
    mask: np.ndarray,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) with a critic.

    ``delta_t = r_t + gamma * V_{t'} - V_t`` and ``A_t = delta_t + gamma * lam * A_{t'}``,
    t' the next trained token; the value after the last token is 0 (the episode ends).
    Returns ``(advantages, returns = advantages + values)``, both (B, T-1) and 0 where
    ``mask`` is 0. ``values[:, t]`` is the critic's value of the prefix that predicts token
    t+1, aligned like log-probabilities.
    """
    rewards = np.asarray(token_rewards, np.float64)
    values = np.asarray(values, np.float64)
    mask = np.asarray(mask) > 0
    advantages = np.zeros(rewards.shape, dtype=np.float64)
    next_value = np.zeros(rewards.shape[0])
    next_adv = np.zeros(rewards.shape[0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        live = mask[:, t]
        advantages[:, t] = np.where(live, adv, 0.0)
        next_value = np.where(live, values[:, t], next_value)
        next_adv = np.where(live, adv, next_adv)
    returns = np.where(mask, advantages + values, 0.0)
    return advantages.astype(np.float32), returns.astype(np.float32)
