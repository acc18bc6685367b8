"""An algorithm config turned into what a step uses: reward shaping, the KL penalty, the
advantage estimator, and the policy and value objectives.

The controller calls these in order; everything here is numpy/torch on the driver, and the
one piece of state is the (possibly adaptive) KL coefficient.
"""

from __future__ import annotations

import numpy as np
import torch

from rlsys.algorithms.advantages import whiten
from rlsys.algorithms.estimators import (
    ADVANTAGES,
    AdvantageInputs,
    Advantages,
    advantage_settings,
)
from rlsys.algorithms.kl import adaptive_kl_coef, kl_estimate
from rlsys.algorithms.objectives import PolicyObjective
from rlsys.algorithms.offpolicy import importance_weights
from rlsys.algorithms.policy_losses import policy_loss_settings
from rlsys.algorithms.shaping import overlong_buffer_len, overlong_penalty
from rlsys.config.algorithm import AlgorithmConfig
from rlsys.types import RolloutGroup, Sample, TrainBatch, Turn


class Recipe:
    """The algorithm of a run, for a task whose replies are at most ``max_new_tokens``."""

    def __init__(self, cfg: AlgorithmConfig, group_size: int, max_new_tokens: int) -> None:
        self.cfg = cfg
        self.group_size = group_size
        self.max_new_tokens = max_new_tokens
        self.estimator = ADVANTAGES.get(cfg.advantage)
        self.advantage_settings = advantage_settings(cfg)
        self.loss_settings = policy_loss_settings(cfg)
        self.kl_coef = cfg.kl_coef
        self.overlong_buffer = overlong_buffer_len(max_new_tokens, cfg.overlong_buffer_frac)

    # ---- rewards -----------------------------------------------------------------------

    def shape_rewards(self, samples: list[Sample]) -> float:
        """Add DAPO's overlong penalty to each sample's reward; returns the mean penalty."""
        if not self.overlong_buffer or not samples:
            return 0.0
        lengths = np.array([len(s.completion.token_ids) for s in samples])
        penalty = overlong_penalty(
            lengths, self.max_new_tokens, self.overlong_buffer, self.cfg.overlong_penalty
        )
        for sample, p in zip(samples, penalty, strict=True):
            sample.reward += float(p)
        return float(penalty.mean())

    def filter_overlong(self, batch: TrainBatch, groups: list[RolloutGroup]) -> int:
        """DAPO overlong filtering: truncated samples keep their reward (their group's
        statistics see them) but get no loss. Returns how many were masked."""
        if not self.cfg.overlong_filter:
            return 0
        truncated = np.array(
            [s.completion.finish_reason == "length" for g in groups for s in g.samples]
        )
        batch.loss_mask[truncated] = 0.0
        return int(truncated.sum())

    # ---- KL to the reference -----------------------------------------------------------

    def token_kl(self, batch: TrainBatch) -> np.ndarray:
        """(B, T-1) per-token KL(policy || reference) estimate of the sampled tokens, 0 off
        the loss mask (the policy's log-probabilities are the learner's, before the update)."""
        kl = kl_estimate(
            torch.tensor(batch.old_logprobs),  # copies: arrays from Ray are read-only
            torch.tensor(batch.ref_logprobs),
            self.cfg.kl_estimator,
            self.cfg.kl_clamp,
        ).numpy()
        return kl * batch.loss_mask

    def update_kl_coef(self, token_kl: np.ndarray, mask: np.ndarray) -> None:
        """Adaptive coefficient (``algorithm.kl_target``): move towards the target KL, measured
        per sequence over the sequences that were trained on."""
        trained = np.asarray(mask).any(-1)
        if self.cfg.kl_target is None or not trained.any():
            return
        self.kl_coef = adaptive_kl_coef(
            self.kl_coef,
            float(token_kl[trained].sum(-1).mean()),
            self.cfg.kl_target,
            int(trained.sum()),
            self.cfg.kl_horizon,
        )

    # ---- advantages and objectives -------------------------------------------------------

    def advantages(
        self,
        batch: TrainBatch,
        token_kl: np.ndarray | None = None,
        baseline_rewards: np.ndarray | None = None,
        tree_segments: list[tuple[tuple[int, int], ...]] | None = None,
        turns: list[list[Turn] | None] | None = None,
    ) -> Advantages:
        """Per-token advantages (and critic targets) of ``batch``, rows ordered by group;
        ``tree_segments``: each row's (tree node, tokens) path (tree rollouts); ``turns``: each
        row's model turns in ``batch`` columns (multi-turn trajectories:
        ``collate.batch_turns``)."""
        cfg = self.cfg
        penalty = None
        if token_kl is not None and cfg.kl_penalty == "reward":
            penalty = self.kl_coef * token_kl
        out = self.estimator(
            AdvantageInputs(
                rewards=batch.rewards,
                mask=batch.loss_mask,
                group_size=self.group_size,
                kl_penalty=penalty,
                values=batch.values,
                baseline_rewards=baseline_rewards,
                tree_segments=tree_segments,
                turns=turns,
            ),
            self.advantage_settings,
        )
        if cfg.whiten_advantages:
            out.advantages = whiten(out.advantages, batch.loss_mask)
        return out

    def off_policy_weights(self, batch: TrainBatch) -> dict[str, float]:
        """Set ``batch.is_weights`` for ``algorithm.off_policy`` (from the behaviour and
        pre-update learner log-probabilities); returns the correction's metrics."""
        batch.is_weights, metrics = importance_weights(
            batch.old_logprobs,
            batch.behaviour_logprobs,
            batch.loss_mask,
            self.cfg.off_policy,
            self.cfg.off_policy_cap,
        )
        return metrics

    def policy_objective(self) -> PolicyObjective:
        """The policy loss with the current KL coefficient (when the KL is a loss term)."""
        cfg = self.cfg
        return PolicyObjective(
            policy_loss=cfg.policy_loss,
            loss_settings=self.loss_settings,
            kl_coef=self.kl_coef if cfg.kl_penalty == "loss" else 0.0,
            kl_estimator=cfg.kl_estimator,
            kl_clamp=cfg.kl_clamp,
            entropy_coef=cfg.entropy_coef,
            loss_agg=cfg.loss_agg,
            loss_agg_norm=float(cfg.loss_agg_norm or self.max_new_tokens),
        )
