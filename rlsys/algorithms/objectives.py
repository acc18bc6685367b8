"""Objectives: the per-token loss a learner minimises, built from the pure functions.

An objective is a small picklable callable ``(outputs, batch) -> (per_token_loss, metrics)``:
``outputs`` is what the model produced for a micro-batch (``logprobs`` and ``entropy`` for a
policy, ``values`` for a critic), ``batch`` its tensors. The learner weighs the per-token loss
with ``loss_weights(mask, objective.loss_agg, ...)`` and sums. A new algorithm is a new
objective (or advantage estimator) plus a preset, never a new trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from rlsys.algorithms.kl import kl_estimate
from rlsys.algorithms.losses import (
    gspo_loss,
    nll_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    value_loss,
)
from rlsys.algorithms.names import POLICY_LOSSES

Tensors = dict[str, torch.Tensor]


class Objective(Protocol):
    """What a learner backend needs of an objective."""

    loss_agg: str  # see losses.loss_weights
    loss_agg_norm: float | None  # seq_sum_norm's constant

    @property
    def entropy_grad(self) -> bool:
        """Whether the policy entropy needs a gradient (an entropy bonus)."""
        ...

    def __call__(self, out: Tensors, batch: Tensors) -> tuple[torch.Tensor, Tensors]: ...


@dataclass(frozen=True)
class PolicyObjective:
    """A policy loss (PPO clip, GSPO or vanilla PG), weighted per token by the batch's
    ``is_weights`` when an off-policy correction is on, an optional KL-to-reference loss term
    and an entropy bonus."""

    policy_loss: str = "ppo_clip"  # one of POLICY_LOSSES
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None  # ppo_clip only
    kl_coef: float = 0.0  # weight of the KL loss term (0: none; a reward penalty is not here)
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    loss_agg: str = "token_mean"  # see losses.loss_weights
    loss_agg_norm: float | None = None  # seq_sum_norm's constant

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropy needs a gradient (only for the bonus)."""
        return self.entropy_coef > 0

    def __call__(self, out: Tensors, batch: Tensors):
        logprobs = out["logprobs"]
        if self.policy_loss == "ppo_clip":
            loss, metrics = ppo_clip_loss(
                logprobs,
                batch["old_logprobs"],
                batch["advantages"],
                self.clip_low,
                self.clip_high,
                self.dual_clip,
            )
        elif self.policy_loss == "gspo":
            loss, metrics = gspo_loss(
                logprobs,
                batch["old_logprobs"],
                batch["advantages"],
                batch["loss_mask"],
                self.clip_low,
                self.clip_high,
            )
        elif self.policy_loss == "vanilla":
            loss, metrics = policy_gradient_loss(logprobs, batch["advantages"])
        else:
            raise ValueError(
                f"algorithm.policy_loss={self.policy_loss!r} is not one of {list(POLICY_LOSSES)}"
            )
        if "is_weights" in batch:  # off-policy correction of the policy-gradient term only
            loss = loss * batch["is_weights"]
        if self.kl_coef > 0:
            kl = kl_estimate(logprobs, batch["ref_logprobs"], self.kl_estimator)
            loss = loss + self.kl_coef * kl
            metrics["kl_ref"] = kl.detach()
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * out["entropy"]
        return loss, metrics


@dataclass(frozen=True)
class ValueObjective:
    """The critic's clipped value regression onto the estimator's returns."""

    clip: float | None = 0.2
    loss_agg: str = "token_mean"
    loss_agg_norm: float | None = None
    entropy_grad: bool = False

    def __call__(self, out: Tensors, batch: Tensors):
        return value_loss(out["values"], batch["values"], batch["returns"], self.clip)


@dataclass(frozen=True)
class SFTObjective:
    """Negative log-likelihood of the response tokens."""

    loss_agg: str = "token_mean"
    loss_agg_norm: float | None = None
    entropy_grad: bool = False

    def __call__(self, out: Tensors, batch: Tensors):
        return nll_loss(out["logprobs"]), {}
