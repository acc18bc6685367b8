"""Config of the RL algorithm: estimator, losses, KL and DAPO's sampling and shaping."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.errors import ConfigError

KL_PENALTIES = ("loss", "reward")  # where the KL term goes: a mode of the recipe, not a plug-in


@dataclass
class AlgorithmConfig:
    """Advantage estimator, policy loss, loss aggregation, KL and DAPO's sampling and shaping.

    The presets in conf/algorithm/ set these together (ppo, grpo, dr_grpo, dapo, gspo, rloo,
    gpg, opo, pass_at_k, gigpo, reinforce_pp, reinforce_pp_baseline, remax, cispo, gmpo, sapo,
    clip_cov, kl_cov, dppo_tv, dppo_kl, dro); docs/algorithms.md says what each one is.
    """

    name: str = "grpo"  # label for logs and presets
    # grpo | dr_grpo | rloo | gpg (r - mean, x B / (B - tied samples); advantage_args
    # batch_scale=verl: x B / non-zero rewards) | opo (r - length-weighted
    # group mean) | pass_at_k | treepo (tree rollouts: sub-tree averages) | treerl (tree
    # rollouts: one advantage per segment) | gigpo (multi-turn: episode + step groups of equal
    # states) | reinforce_pp | reinforce_pp_baseline | remax | gae (starts a critic)
    advantage: str = "grpo"
    # grpo, treepo, treerl, gigpo: divide by the (sub- or step) group's reward std
    normalize_std: bool = True
    # pass_at_k: the k of pass@k (1 <= k < rollout.n_samples; k = 1 is GRPO with the population
    # std); a reward above 0.5 counts as a pass
    pass_k: int = 4
    # discount of gae, reinforce_pp, gigpo's step returns (over turns) and the KL-penalty
    # reward-to-go
    gamma: float = 1.0
    lam: float = 0.95  # GAE lambda (bias-variance trade-off of the critic's advantages)
    # gigpo: weight of the step-level advantage added to the episode-level one (the paper's
    # omega; 0 gives GRPO's advantage on every model token)
    gigpo_step_weight: float = 1.0
    whiten_advantages: bool = False  # normalise advantages over the batch's tokens (PPO)
    # ppo_clip | gspo (sequence-level ratio) | vanilla (REINFORCE) | cispo (clipped, detached
    # importance weight) | gmpo (geometric mean of token ratios) | sapo (soft sigmoid gate) |
    # clip_cov / kl_cov (PPO with high-covariance tokens detached / unclipped with a KL
    # penalty on them, against entropy collapse) | dppo_tv / dppo_kl (a mask on the binary TV /
    # KL of the sampled token instead of the ratio clip) | dro (policy gradient plus a
    # quadratic log-ratio penalty); the last three take their settings from policy_loss_args
    policy_loss: str = "ppo_clip"
    # ratio clip (low side); GSPO uses ~3e-4 (a sequence-level ratio); cispo clips the weight
    # (>= 1: no lower bound); gmpo reads clip_eps / clip_eps_high as log-ratio bounds (0.4)
    clip_eps: float = 0.2
    # Clip-higher (DAPO): a wider upper range lets unlikely tokens with positive advantage
    # grow, which keeps exploration alive; null makes the range symmetric (= clip_eps).
    clip_eps_high: float | None = 0.28
    # ppo_clip, clip_cov: bound negative-advantage losses at c * |A| (c > 1)
    dual_clip: float | None = None
    # gspo, gmpo: the sequence log-ratio is clamped here (zero gradient beyond), bounding a
    # stale sample's loss per token at |A| e^clamp
    gspo_log_ratio_clamp: float = 10.0
    # sapo: temperature of the gate sigmoid(tau (ratio - 1)) * 4 / tau for positive advantages
    # (a larger tau fades the gradient faster as the ratio leaves 1)
    sapo_tau_pos: float = 1.0
    # sapo: the gate's temperature for negative advantages; SAPO makes it the larger (1.05),
    # as negative updates spread probability over many unsampled tokens
    sapo_tau_neg: float = 1.05
    # clip_cov, kl_cov: fraction of a micro-batch's trained tokens picked by covariance of
    # log-probability and advantage (at least one); the paper's 2e-4 / 2e-3 suit batches of
    # millions of tokens, not this project's micro-batches of ~100
    cov_ratio: float = 0.02
    clip_cov_low: float = 1.0  # clip_cov: tokens with covariance in [low, high] are candidates
    clip_cov_high: float = 5.0  # clip_cov: upper end of that range
    kl_cov_coef: float = 1.0  # kl_cov: weight of |log pi - log pi_old| on the picked tokens
    # How per-token losses become one number: token_mean | seq_mean_token_sum |
    # seq_mean_token_mean | seq_sum_norm (Dr.GRPO: token sum / loss_agg_norm, mean over sequences)
    # | token_sum (no normaliser: the gradient grows with the tokens; scale the lr down)
    loss_agg: str = "token_mean"
    loss_agg_norm: int | None = None  # seq_sum_norm's constant; null: the task's max_new_tokens
    kl_coef: float = 0.0  # > 0 starts the reference group and penalises KL(policy || reference)
    # k1 | k2 | k3 (Schulman's low-variance estimator) | abs (|log r|) | k1+ / k3+ (the value
    # of k1 / k3 with k2's gradient, that of KL(policy || reference))
    kl_estimator: str = "k3"
    # Per-token KL estimates clamped to [-kl_clamp, kl_clamp] (zero gradient beyond): one stale
    # or mismatched token cannot dominate the loss (k3 is 2,972 at a log-ratio of 8). null: none
    kl_clamp: float | None = 10.0
    kl_penalty: str = "loss"  # "loss": a loss term; "reward": subtracted from token rewards
    kl_target: float | None = None  # adaptive coefficient (Ziegler 2019): target KL per sequence
    kl_horizon: int = 10000  # adaptive coefficient: samples over which it moves by up to 20%
    entropy_coef: float = 0.0  # > 0 adds an entropy bonus to the loss
    filter_uniform_groups: bool = True  # drop groups whose rewards are all equal (no signal)
    # DAPO dynamic sampling: groups the filter drops are replaced by new prompts until
    # data.batch_size groups have signal, drawing at most max_sampling_rounds x data.batch_size
    # prompts per step (counted over the run: a step that needed fewer leaves room for later).
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 4  # dynamic sampling: prompts drawn per step, x data.batch_size
    # DAPO soft overlong punishment: the last overlong_buffer_frac of the generation budget
    # costs up to overlong_penalty reward (0: off; DAPO used 4096 of 20480 tokens = 0.2).
    overlong_buffer_frac: float = 0.0
    overlong_penalty: float = 1.0  # the largest overlong punishment (reward units)
    overlong_filter: bool = False  # DAPO overlong filtering: truncated samples get no loss
    # Correction for samples drawn by another policy than the learner's (older weights in
    # async training; the engine's numerics in any mode): none | tis (truncated importance
    # sampling, weight min(pi_old/pi_behaviour, off_policy_cap)) | decoupled (decoupled PPO:
    # clip around the learner before the update, weight pi_old/pi_behaviour, tokens whose
    # weight exceeds off_policy_cap get none). See rlsys/algorithms/offpolicy.py.
    off_policy: str = "none"
    off_policy_cap: float = 2.0  # the importance-weight bound of tis / decoupled (>= 1)
    # The policy loss's own settings by name, over what the flat keys above give it (each
    # loss's settings class in rlsys/algorithms/policy_losses.py lists them), e.g.
    # {tau_pos: 0.5} for sapo; a loss added in a plugin takes all of its settings here.
    policy_loss_args: dict[str, Any] = field(default_factory=dict)
    # The advantage estimator's own settings by name, over what the flat keys above give it
    # (each estimator's settings class in rlsys/algorithms/estimators.py lists them), e.g.
    # {lam: 0.9} for gae; an estimator added in a plugin takes all of its settings here.
    advantage_args: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # The names (advantage, policy_loss, loss_agg, kl_estimator, off_policy) and what their
        # traits forbid are checked where the registries are: rlsys.resolve.
        if self.pass_k < 1:
            raise ConfigError(
                f"algorithm.pass_k={self.pass_k} must be >= 1 (the k of pass@k); set it to a k "
                "below rollout.n_samples, e.g. 4 with 8 samples"
            )
        if self.kl_clamp is not None:
            positive("algorithm.kl_clamp", self.kl_clamp)
        positive("algorithm.gspo_log_ratio_clamp", self.gspo_log_ratio_clamp)
        positive("algorithm.sapo_tau_pos", self.sapo_tau_pos)
        positive("algorithm.sapo_tau_neg", self.sapo_tau_neg)
        if not 0 < self.cov_ratio <= 1:
            raise ConfigError(
                f"algorithm.cov_ratio={self.cov_ratio} must be in (0, 1]: it is the fraction of "
                "a micro-batch's trained tokens that clip_cov / kl_cov pick (0.02 is usual here)"
            )
        if self.clip_cov_low > self.clip_cov_high:
            raise ConfigError(
                f"algorithm.clip_cov_low={self.clip_cov_low} exceeds algorithm.clip_cov_high="
                f"{self.clip_cov_high}, so clip_cov has no candidate tokens; set clip_cov_low "
                "<= clip_cov_high (the paper: 1 and 5)"
            )
        non_negative("algorithm.kl_cov_coef", self.kl_cov_coef)
        one_of("algorithm.kl_penalty", self.kl_penalty, KL_PENALTIES)
        if self.off_policy_cap < 1:
            raise ConfigError(
                f"algorithm.off_policy_cap={self.off_policy_cap} must be >= 1 (2.0 is usual): "
                "a cap below 1 down-weights on-policy tokens"
            )
        positive("algorithm.clip_eps", self.clip_eps)
        if self.clip_eps_high is not None:
            positive("algorithm.clip_eps_high", self.clip_eps_high)
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ConfigError(
                f"algorithm.dual_clip={self.dual_clip} must be > 1 (3.0 is usual) or null"
            )
        if not 0 < self.gamma <= 1:
            raise ConfigError(f"algorithm.gamma={self.gamma} must be in (0, 1]")
        if not 0 <= self.lam <= 1:
            raise ConfigError(f"algorithm.lam={self.lam} must be in [0, 1]")
        non_negative("algorithm.gigpo_step_weight", self.gigpo_step_weight)
        if self.loss_agg_norm is not None:
            positive("algorithm.loss_agg_norm", self.loss_agg_norm)
        non_negative("algorithm.kl_coef", self.kl_coef)
        if self.kl_target is not None:
            positive("algorithm.kl_target", self.kl_target)
            if self.kl_coef == 0:
                raise ConfigError(
                    "algorithm.kl_target adapts algorithm.kl_coef, which is 0; set "
                    "algorithm.kl_coef to a starting value (e.g. 0.05) or kl_target=null"
                )
        positive("algorithm.kl_horizon", self.kl_horizon)
        non_negative("algorithm.entropy_coef", self.entropy_coef)
        if not 1 <= self.max_sampling_rounds <= 100:
            raise ConfigError(
                f"algorithm.max_sampling_rounds={self.max_sampling_rounds} must be in [1, 100]"
            )
        if self.dynamic_sampling and not self.filter_uniform_groups:
            raise ConfigError(
                "algorithm.dynamic_sampling=true refills the groups that "
                "algorithm.filter_uniform_groups drops; set algorithm.filter_uniform_groups=true"
            )
        if not 0 <= self.overlong_buffer_frac < 1:
            raise ConfigError(
                f"algorithm.overlong_buffer_frac={self.overlong_buffer_frac} must be in [0, 1)"
            )
        non_negative("algorithm.overlong_penalty", self.overlong_penalty)

    @property
    def uses_reference(self) -> bool:
        """Whether a frozen reference policy is needed (any KL term)."""
        return self.kl_coef > 0
