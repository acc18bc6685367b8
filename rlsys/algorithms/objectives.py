"""Objectives: the per-token loss a learner minimises, built from the pure functions.

An objective is a small picklable callable ``(outputs, batch) -> (per_token_loss, metrics)``:
``outputs`` is what the model produced for a micro-batch (``logprobs`` and ``entropy`` for a
policy, ``values`` for a critic), ``batch`` its tensors. The learner weighs the per-token loss
with ``loss_weights(mask, objective.loss_agg, ...)`` and sums. A new algorithm is a new
objective (or advantage estimator) plus a preset, never a new trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from rlsys.algorithms.kl import kl_estimate
from rlsys.algorithms.losses import nll_loss, value_loss
from rlsys.algorithms.policy_losses import POLICY_LOSSES, PolicyLossInputs
from rlsys.algorithms.preference import bradley_terry_loss, dpo_loss, spread_over_pairs
from rlsys.algorithms.settings import NoSettings

Tensors = dict[str, torch.Tensor]


class Objective(Protocol):
    """What a learner backend needs of an objective."""

    loss_agg: str  # see losses.loss_weights
    loss_agg_norm: float | None  # seq_sum_norm's constant
    rows_per_group: int  # rows that must share a micro-batch (2: preference pairs)

    @property
    def entropy_grad(self) -> bool:
        """Whether the policy entropy needs a gradient (an entropy bonus)."""
        ...

    def __call__(self, out: Tensors, batch: Tensors) -> tuple[torch.Tensor, Tensors]: ...


def needs_old_logprobs(epochs: int, num_mini_batches: int, off_policy: str, kl_ref: bool) -> bool:
    """Whether a policy update needs the learner's log-probabilities before it from a pass of
    their own (``old_logprobs``).

    With one epoch of one mini-batch, every micro-batch's training forward pass runs at the
    weights the update starts from, so the "old" log-probabilities are those of that very pass
    (detached): the loss and gradient are the same, and the separate pass is redundant (as in
    TRL's GRPOTrainer with one iteration). That holds whatever the rollouts' staleness: the
    PPO ratio is taken against the proximal policy (the learner's current weights), not the
    behaviour policy. The pass is needed for several epochs or mini-batches (later optimizer
    steps start from moved weights), and when the controller uses the log-probabilities
    before training: an off-policy correction (``algorithm.off_policy``) and the KL to a
    reference (``kl_ref``).
    """
    return epochs > 1 or num_mini_batches > 1 or off_policy != "none" or kl_ref


@dataclass(frozen=True)
class PolicyObjective:
    """A policy loss of ``POLICY_LOSSES`` (PPO clip, GSPO, vanilla PG, ...), weighted per
    token by the batch's ``is_weights`` when an off-policy correction is on, an optional
    KL-to-reference loss term and an entropy bonus. The ratio is taken against the batch's
    ``old_logprobs``, or, when it has none, against this pass's own log-probabilities,
    detached (one optimizer step per batch: see ``needs_old_logprobs``)."""

    policy_loss: str = "ppo_clip"  # a name in policy_losses.POLICY_LOSSES
    # its settings (a frozen dataclass: policy_losses.policy_loss_settings); None: the
    # registered settings class's defaults
    loss_settings: Any = None
    kl_coef: float = 0.0  # weight of the KL loss term (0: none; a reward penalty is not here)
    kl_estimator: str = "k3"
    kl_clamp: float | None = 10.0  # per-token bound of the KL term (see kl.kl_estimate)
    entropy_coef: float = 0.0
    loss_agg: str = "token_mean"  # see losses.loss_weights
    loss_agg_norm: float | None = None  # seq_sum_norm's constant
    rows_per_group: int = 1

    def __post_init__(self) -> None:
        if self.loss_settings is None:  # once, not per micro-batch
            defaults = (POLICY_LOSSES.settings(self.policy_loss) or NoSettings)()
            object.__setattr__(self, "loss_settings", defaults)

    @property
    def entropy_grad(self) -> bool:
        """Whether the entropy needs a gradient (only for the bonus)."""
        return self.entropy_coef > 0

    def __call__(self, out: Tensors, batch: Tensors):
        logprobs = out["logprobs"]
        old = batch.get("old_logprobs")
        from_this_pass = old is None  # see needs_old_logprobs: at the pre-update weights
        if from_this_pass:
            old = logprobs.detach()
        policy_loss = POLICY_LOSSES.get(self.policy_loss)
        inputs = PolicyLossInputs(logprobs, old, batch["advantages"], batch["loss_mask"])
        loss, metrics = policy_loss(inputs, self.loss_settings)
        if from_this_pass and "behaviour_logprobs" in batch:
            # engine vs learner before the update (the controller's metric when it has them)
            metrics["logprob_mismatch"] = (batch["behaviour_logprobs"] - old).abs()
        if "is_weights" in batch:  # off-policy correction of the policy-gradient term only
            loss = loss * batch["is_weights"]
        if self.kl_coef > 0:
            kl = kl_estimate(logprobs, batch["ref_logprobs"], self.kl_estimator, self.kl_clamp)
            loss = loss + self.kl_coef * kl
            metrics["kl_ref"] = kl.detach()
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * out["entropy"]
        return loss, metrics


def inert_rows(
    objective: Objective, advantages: np.ndarray | None, loss_mask: np.ndarray
) -> np.ndarray | None:
    """(B,) bool: the rows whose loss and gradient under ``objective`` are exactly zero
    whatever the model computes, or None where that cannot be said (the learner leaves them
    out of its pass: ``learner.skip_zero_advantage``).

    A policy objective's row is inert when its advantage is 0 on every trained token and the
    loss is ``advantage_weighted`` (every term multiplied by the advantage: PPO's clip, GSPO,
    CISPO, ...; the off-policy weights multiply it too), with no KL term and no entropy
    bonus, which move every token. A group of tied rewards is such rows under GRPO-family
    estimators. Every other objective (critic, SFT, preference) has none.
    """
    if not isinstance(objective, PolicyObjective) or advantages is None:
        return None
    if objective.kl_coef > 0 or objective.entropy_coef > 0:
        return None
    if not POLICY_LOSSES.trait(objective.policy_loss, "advantage_weighted"):
        return None
    return ~((advantages != 0) & (loss_mask > 0)).any(-1)


@dataclass(frozen=True)
class ValueObjective:
    """The critic's clipped value regression onto the estimator's returns."""

    clip: float | None = 0.2
    loss_agg: str = "token_mean"
    loss_agg_norm: float | None = None
    entropy_grad: bool = False
    rows_per_group: int = 1

    def __call__(self, out: Tensors, batch: Tensors):
        return value_loss(out["values"], batch["values"], batch["returns"], self.clip)


@dataclass(frozen=True)
class SFTObjective:
    """Negative log-likelihood of the response tokens."""

    loss_agg: str = "token_mean"
    loss_agg_norm: float | None = None
    entropy_grad: bool = False
    rows_per_group: int = 1

    def __call__(self, out: Tensors, batch: Tensors):
        return nll_loss(out["logprobs"]), {}


def _pairs(per_row: torch.Tensor, mask: torch.Tensor):
    """(chosen, rejected) halves of a per-row value, rows 2i / 2i+1 being pair i; None for
    the backend's one-row dummy micro-batch (a rank with no rows)."""
    if per_row.shape[0] % 2:
        return None
    return per_row[0::2], per_row[1::2]


def _pair_loss(loss: torch.Tensor, metrics: Tensors, mask: torch.Tensor):
    return spread_over_pairs(loss, mask), {
        k: spread_over_pairs(v, mask) for k, v in metrics.items()
    }


def _nothing(per_row: torch.Tensor, mask: torch.Tensor):
    """A zero loss still attached to the graph, so a dummy micro-batch takes part in the
    backward collectives."""
    return torch.zeros_like(mask) + 0.0 * per_row.sum(), {}


@dataclass(frozen=True)
class RewardModelObjective:
    """Bradley-Terry loss of a reward model on (chosen, rejected) rows; see
    ``preference.bradley_terry_loss``. ``out["scores"]`` is one score per row."""

    loss_agg: str = "seq_mean_token_mean"  # with spread_over_pairs: the mean over pairs
    loss_agg_norm: float | None = None
    entropy_grad: bool = False
    rows_per_group: int = 2

    def __call__(self, out: Tensors, batch: Tensors):
        scores, mask = out["scores"], batch["loss_mask"]
        pairs = _pairs(scores, mask)
        if pairs is None:
            return _nothing(scores, mask)
        return _pair_loss(*bradley_terry_loss(*pairs), mask)


@dataclass(frozen=True)
class DPOObjective:
    """DPO / IPO / conservative DPO on (chosen, rejected) rows, from the policy's response
    log-probabilities and the batch's cached ``ref_logprobs``; see ``preference.dpo_loss``."""

    beta: float = 0.1
    variant: str = "dpo"
    label_smoothing: float = 0.0
    nll_coef: float = 0.0  # RPO's NLL term on the chosen replies (0: none)
    loss_agg: str = "seq_mean_token_mean"  # with spread_over_pairs: the mean over pairs
    loss_agg_norm: float | None = None
    entropy_grad: bool = False
    rows_per_group: int = 2

    def __call__(self, out: Tensors, batch: Tensors):
        mask = batch["loss_mask"]
        policy = (out["logprobs"] * mask).sum(-1)
        tokens = mask.sum(-1)
        reference = (batch["ref_logprobs"] * mask).sum(-1)
        pairs = _pairs(policy, mask)
        if pairs is None:
            return _nothing(policy, mask)
        ref_chosen, ref_rejected = _pairs(reference, mask)
        loss, metrics = dpo_loss(
            *pairs,
            ref_chosen,
            ref_rejected,
            self.beta,
            self.variant,
            self.label_smoothing,
            self.nll_coef,
            tokens[0::2],
        )
        return _pair_loss(loss, metrics, mask)
