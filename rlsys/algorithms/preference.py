"""Pairwise preference losses: pure torch functions of per-pair scores, no model state.

Each takes one value per pair (chosen and rejected side, shape (P,)) and returns the loss
per pair (P,) to be minimised plus detached per-pair metrics. ``rlsys.algorithms.objectives``
spreads them over the pair's tokens for the learner backends. ``PREFERENCE_LOSSES``
(``dpo.loss``) holds the DPO variants.

Torch is not imported here (tensor methods only): the config validates ``dpo.loss`` against
``PREFERENCE_LOSSES`` without paying for torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rlsys.registry import Registry

if TYPE_CHECKING:
    import torch


def log_sigmoid(x: torch.Tensor) -> torch.Tensor:
    """``log sigmoid(x) = -log(1 + exp(-x))``, computed stably as ``-logaddexp(0, -x)``."""
    return -(-x).logaddexp(x.new_zeros(()))


def bradley_terry_loss(
    chosen: torch.Tensor, rejected: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model loss of a preference pair: ``-log sigmoid(r_chosen - r_rejected)``, the
    negative log-likelihood of the label under a Bradley-Terry model (Bradley & Terry 1952),
    as in InstructGPT (Ouyang et al. 2022, eq. 1).

    Departure: pairs are independent rows, not all K-choose-2 comparisons of one prompt
    batched together (InstructGPT's trick against over-fitting to a prompt); a dataset with
    several comparisons per prompt simply lists them. Metrics: ``accuracy`` (chosen scored
    strictly higher), ``margin`` (r_chosen - r_rejected), ``chosen`` and ``rejected``."""
    margin = chosen - rejected
    loss = -log_sigmoid(margin)
    metrics = {
        "accuracy": (margin > 0).float(),
        "margin": margin.detach(),
        "chosen": chosen.detach(),
        "rejected": rejected.detach(),
    }
    return loss, metrics


# A DPO variant maps the log-ratio gap h (P,), beta and label_smoothing to the loss per pair.
PreferenceLoss = Callable[["torch.Tensor", float, float], "torch.Tensor"]
PREFERENCE_LOSSES: Registry[PreferenceLoss] = Registry("preference loss", "dpo.loss")


@PREFERENCE_LOSSES.register("dpo")
def dpo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """``-log sigmoid(beta h)`` (Rafailov et al. 2023, eq. 7)."""
    return -log_sigmoid(beta * h)


@PREFERENCE_LOSSES.register("cdpo")
def cdpo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """Conservative DPO: ``-(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h)``."""
    eps = label_smoothing
    return -(1.0 - eps) * log_sigmoid(beta * h) - eps * log_sigmoid(-beta * h)


@PREFERENCE_LOSSES.register("ipo")
def ipo(h: torch.Tensor, beta: float, label_smoothing: float) -> torch.Tensor:
    """IPO: ``(h - 1 / (2 beta))^2``."""
    return (h - 1.0 / (2.0 * beta)) ** 2


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    variant: str = "dpo",
    label_smoothing: float = 0.0,
    nll_coef: float = 0.0,
    chosen_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Direct preference optimisation on summed response log-probabilities (P,) of the policy
    and the frozen reference. With ``h = (log pi(y_w) - log ref(y_w)) - (log pi(y_l) -
    log ref(y_l))``:

    - ``dpo``: ``-log sigmoid(beta h)`` (Rafailov et al. 2023, eq. 7);
    - ``cdpo``: conservative DPO, ``-(1 - e) log sigmoid(beta h) - e log sigmoid(-beta h)``
      with ``e = label_smoothing`` the assumed fraction of flipped labels (Mitchell 2023,
      "A note on DPO with noisy preferences"); ``e = 0`` is ``dpo``;
    - ``ipo``: ``(h - 1 / (2 beta))^2`` (Azar et al. 2023, "A General Theoretical Paradigm to
      Understand Learning from Human Preferences", eq. 17, its empirical form with ``tau =
      beta``), which regresses the log-ratio gap to a finite target instead of pushing it to
      infinity on deterministic preferences.

    ``nll_coef = a > 0`` adds ``a * NLL(y_w) / |y_w|``, the chosen reply's negative
    log-likelihood per token (``chosen_tokens`` (P,) counts its tokens), to any variant: the
    NLL term of RPO (Pang et al. 2024, "Iterative Reasoning Preference Optimization", eq. 1,
    with a = 1). DPO's loss alone can be lowered by pushing both replies' likelihoods down, as
    long as the rejected one falls faster; the probability mass then goes to replies neither
    side holds, which the NLL term prevents.

    Departure: IPO on summed (not length-averaged) log-probabilities, as in the paper; some
    implementations average over tokens. Metrics: the implicit rewards
    ``beta (log pi - log ref)`` of each side (``reward_chosen``, ``reward_rejected``), their
    ``margin`` and ``accuracy`` (margin > 0), and ``nll_chosen`` (per token) with the NLL
    term."""
    variant_loss = PREFERENCE_LOSSES.get(variant)
    if beta <= 0:
        raise ValueError(f"dpo.beta={beta} must be positive")
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    h = chosen_ratio - rejected_ratio
    loss = variant_loss(h, beta, label_smoothing)
    metrics = {
        "reward_chosen": beta * chosen_ratio.detach(),
        "reward_rejected": beta * rejected_ratio.detach(),
        "margin": beta * h.detach(),
        "accuracy": (h > 0).float(),
    }
    if nll_coef > 0:
        if chosen_tokens is None:
            raise ValueError("dpo_loss: nll_coef > 0 needs chosen_tokens (the reply lengths)")
        nll = -policy_chosen / chosen_tokens.clamp(min=1.0)
        loss = loss + nll_coef * nll
        metrics["nll_chosen"] = nll.detach()
    return loss, metrics


def spread_over_pairs(per_pair: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T-1) per-token values from one value per pair, where rows 2i and 2i+1 are pair i:
    every response token of both rows carries its pair's value. With the
    ``seq_mean_token_mean`` weighting each row then counts ``value / sequences``, so a pair
    counts ``value / pairs``: the batch loss is the mean over pairs."""
    return per_pair.repeat_interleave(2).unsqueeze(-1).expand_as(mask)
