"""Objectives: the per-token loss a learner minimises, built from the pure functions.

An objective is a small picklable callable ``(logprobs, entropy, batch) -> (per_token_loss,
metrics)``; the learner masks and aggregates. A new algorithm is a new objective (or
advantage estimator) plus a preset, never a new trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlsys.algorithms.losses import kl_estimate, nll_loss, ppo_clip_loss

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PolicyGradientObjective:
    """PPO-clip policy loss with an optional KL-to-reference term and entropy bonus."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0

    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor, batch: Tensors):
        loss, metrics = ppo_clip_loss(
            logprobs, batch["old_logprobs"], batch["advantages"], self.clip_low, self.clip_high
        )
        if self.kl_coef > 0:
            kl = kl_estimate(logprobs, batch["ref_logprobs"], self.kl_estimator)
            loss = loss + self.kl_coef * kl
            metrics["kl_ref"] = kl.detach()
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * entropy
        return loss, metrics


@dataclass(frozen=True)
class SFTObjective:
    """Negative log-likelihood of the response tokens."""

    def __call__(self, logprobs: torch.Tensor, entropy: torch.Tensor, batch: Tensors):
        return nll_loss(logprobs), {}
