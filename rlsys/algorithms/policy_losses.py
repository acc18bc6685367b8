"""The policy losses ``algorithm.policy_loss`` names, each registered with its own settings.

A registered loss is ``(PolicyLossInputs, settings) -> (per_token_loss, metrics)``: the
inputs are a micro-batch's tensors only, the settings a frozen dataclass of that loss's own
knobs (``rlsys.algorithms.settings``), built once per run from the flat ``algorithm.*`` keys
the presets use and from ``algorithm.policy_loss_args``. The formulas are the pure functions
of ``rlsys.algorithms.losses`` and ``divergence_losses`` (papers and departures in their
docstrings).

Traits: ``ratio`` (an importance ratio against old_logprobs, or another anchor to it: the
loss stays right over several optimizer steps per batch and on stale samples),
``dual_clip`` (honours algorithm.dual_clip). Torch is not imported here (a config resolves
without it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlsys.algorithms.divergence_losses import dppo_kl_loss, dppo_tv_loss, dro_loss
from rlsys.algorithms.losses import (
    Metrics,
    cispo_loss,
    clip_cov_loss,
    gmpo_loss,
    gspo_loss,
    kl_cov_loss,
    policy_gradient_loss,
    ppo_clip_loss,
    sapo_loss,
)
from rlsys.algorithms.settings import NoSettings, build_settings, setting
from rlsys.config.checks import non_negative, positive
from rlsys.config.errors import ConfigError
from rlsys.registry import Registry

if TYPE_CHECKING:
    import torch

    from rlsys.config.algorithm import AlgorithmConfig


@dataclass
class PolicyLossInputs:
    """The tensors of a micro-batch a policy loss reads, (B, T-1) each."""

    logprobs: torch.Tensor  # log pi(a|s) of the sampled tokens under the learner (gradient)
    old_logprobs: torch.Tensor  # the same before the update (the proximal policy), detached
    advantages: torch.Tensor  # per-token advantages
    mask: torch.Tensor  # 1 on trained response tokens


PolicyLoss = Callable[[PolicyLossInputs, Any], "tuple[torch.Tensor, Metrics]"]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", "algorithm.policy_loss")


def policy_loss_settings(algo: AlgorithmConfig) -> Any:
    """The settings of ``algo.policy_loss``, from the flat keys and ``policy_loss_args``;
    raises ConfigError naming a bad one."""
    cls = POLICY_LOSSES.settings(algo.policy_loss) or NoSettings
    return build_settings(
        cls,
        algo,
        dict(algo.policy_loss_args),
        "algorithm.policy_loss_args",
        f"algorithm.policy_loss={algo.policy_loss}",
    )


# ---- settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClipSettings:
    """The trust region of a clipped ratio: [1 - clip_low, 1 + clip_high], and the dual clip
    (a bound on a negative advantage's loss, > 1, or None)."""

    clip_low: float = setting(0.2, "clip_eps")
    clip_high: float = setting(0.2, ("clip_eps_high", "clip_eps"))
    dual_clip: float | None = setting(None, "dual_clip")

    def __post_init__(self) -> None:
        _check_clip(self)


@dataclass(frozen=True)
class SequenceClipSettings:
    """A clipped ratio of whole sequences (GSPO, GMPO), with a clamp on the log-ratio before
    it is exponentiated."""

    clip_low: float = setting(0.2, "clip_eps")
    clip_high: float = setting(0.2, ("clip_eps_high", "clip_eps"))
    log_ratio_clamp: float = setting(10.0, "gspo_log_ratio_clamp")

    def __post_init__(self) -> None:
        _check_clip(self)
        positive(_ARGS + "log_ratio_clamp", self.log_ratio_clamp)


@dataclass(frozen=True)
class SapoSettings:
    """SAPO's soft gate temperatures for positive and negative advantages."""

    tau_pos: float = setting(1.0, "sapo_tau_pos")
    tau_neg: float = setting(1.05, "sapo_tau_neg")

    def __post_init__(self) -> None:
        positive(_ARGS + "tau_pos", self.tau_pos)
        positive(_ARGS + "tau_neg", self.tau_neg)


@dataclass(frozen=True)
class ClipCovSettings:
    """PPO's clip plus Clip-Cov's selection: ``cov_ratio`` of the trained tokens, those whose
    covariance lies in [cov_low, cov_high], lose their gradient."""

    clip_low: float = setting(0.2, "clip_eps")
    clip_high: float = setting(0.2, ("clip_eps_high", "clip_eps"))
    cov_ratio: float = setting(0.02, "cov_ratio")
    cov_low: float = setting(1.0, "clip_cov_low")
    cov_high: float = setting(5.0, "clip_cov_high")
    dual_clip: float | None = setting(None, "dual_clip")

    def __post_init__(self) -> None:
        _check_clip(self)
        _check_cov_ratio(self.cov_ratio)
        if self.cov_low > self.cov_high:
            raise ConfigError(
                f"{_ARGS}cov_low={self.cov_low} exceeds cov_high={self.cov_high}: clip_cov "
                "would pick no token; set cov_low <= cov_high"
            )


@dataclass(frozen=True)
class KLCovSettings:
    """KL-Cov: the ``cov_ratio`` highest-covariance tokens pay ``coef`` x |log ratio|."""

    cov_ratio: float = setting(0.02, "cov_ratio")
    coef: float = setting(1.0, "kl_cov_coef")

    def __post_init__(self) -> None:
        _check_cov_ratio(self.cov_ratio)
        non_negative(_ARGS + "coef", self.coef)


@dataclass(frozen=True)
class DppoTVSettings:
    """DPPO-Binary-TV's trust region: a token is masked once ``pi - pi_old`` passes
    ``delta_high`` (A > 0) or ``-delta_low`` (A <= 0); ``ratio_cap`` truncates its importance
    weight. Set through ``algorithm.policy_loss_args`` (no flat keys: these are probability
    shifts, not ratio ranges)."""

    delta_low: float = setting(0.15)  # verl's DPPO example: 0.15 for binary TV
    delta_high: float = setting(0.15)
    # verl's function falls back to 20 (its example run: 1e4, in effect none); the paper
    # warns a small cap biases the update (its section 5.4)
    ratio_cap: float = setting(20.0)

    def __post_init__(self) -> None:
        positive(_ARGS + "delta_low", self.delta_low)
        positive(_ARGS + "delta_high", self.delta_high)
        if self.ratio_cap < 1:
            raise ConfigError(
                f"{_ARGS}ratio_cap={self.ratio_cap} must be >= 1 (a cap on the importance "
                "weight; 20 is the default, larger truncates less)"
            )


@dataclass(frozen=True)
class DppoKLSettings(DppoTVSettings):
    """DPPO-Binary-KL's trust region: bounds on the binary KL of the sampled token, per
    direction (``delta_low`` for A <= 0, ``delta_high`` for A > 0)."""

    delta_low: float = setting(0.05)  # verl's DPPO example: 0.05 for binary KL
    delta_high: float = setting(0.05)


@dataclass(frozen=True)
class DroSettings:
    """DRO's weight of the quadratic log-ratio penalty (the paper's tau; verl's dro_beta)."""

    # verl has no default (it refuses to run without one); 0.05 is a starting point, untuned
    beta: float = setting(0.05)

    def __post_init__(self) -> None:
        positive(_ARGS + "beta", self.beta)


# Values from the flat keys were checked with the config (naming those keys): a failure here
# comes from algorithm.policy_loss_args.
_ARGS = "algorithm.policy_loss_args."


def _check_clip(s: ClipSettings | SequenceClipSettings | ClipCovSettings) -> None:
    positive(_ARGS + "clip_low", s.clip_low)
    positive(_ARGS + "clip_high", s.clip_high)
    dual_clip = getattr(s, "dual_clip", None)
    if dual_clip is not None and dual_clip <= 1:
        raise ConfigError(f"{_ARGS}dual_clip={dual_clip} must be > 1 (3.0 is usual) or null")


def _check_cov_ratio(ratio: float) -> None:
    if not 0 < ratio <= 1:
        raise ConfigError(
            f"{_ARGS}cov_ratio={ratio} must be in (0, 1]: the fraction of a micro-batch's "
            "trained tokens picked (0.02 is usual)"
        )


# ---- the losses ----------------------------------------------------------------------------


@POLICY_LOSSES.register(
    "ppo_clip", settings=ClipSettings, ratio=True, dual_clip=True, advantage_weighted=True
)
def ppo_clip(x: PolicyLossInputs, s: ClipSettings) -> tuple[torch.Tensor, Metrics]:
    return ppo_clip_loss(
        x.logprobs, x.old_logprobs, x.advantages, s.clip_low, s.clip_high, s.dual_clip
    )


def _sequence_clip(loss: Callable) -> PolicyLoss:
    """GSPO and GMPO take the same inputs: a clipped sequence ratio with a log-ratio clamp."""

    def apply(x: PolicyLossInputs, s: SequenceClipSettings) -> tuple[torch.Tensor, Metrics]:
        args = (s.clip_low, s.clip_high, s.log_ratio_clamp)
        return loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, *args)

    return apply


gspo = POLICY_LOSSES.register(
    "gspo", settings=SequenceClipSettings, ratio=True, advantage_weighted=True
)(_sequence_clip(gspo_loss))
gmpo = POLICY_LOSSES.register(
    "gmpo", settings=SequenceClipSettings, ratio=True, advantage_weighted=True
)(_sequence_clip(gmpo_loss))


@POLICY_LOSSES.register("cispo", settings=ClipSettings, ratio=True, advantage_weighted=True)
def cispo(x: PolicyLossInputs, s: ClipSettings) -> tuple[torch.Tensor, Metrics]:
    return cispo_loss(x.logprobs, x.old_logprobs, x.advantages, s.clip_low, s.clip_high)


@POLICY_LOSSES.register("sapo", settings=SapoSettings, ratio=True, advantage_weighted=True)
def sapo(x: PolicyLossInputs, s: SapoSettings) -> tuple[torch.Tensor, Metrics]:
    return sapo_loss(x.logprobs, x.old_logprobs, x.advantages, s.tau_pos, s.tau_neg)


@POLICY_LOSSES.register("clip_cov", settings=ClipCovSettings, ratio=True, dual_clip=True)
def clip_cov(x: PolicyLossInputs, s: ClipCovSettings) -> tuple[torch.Tensor, Metrics]:
    return clip_cov_loss(
        x.logprobs,
        x.old_logprobs,
        x.advantages,
        x.mask,
        s.clip_low,
        s.clip_high,
        s.cov_ratio,
        s.cov_low,
        s.cov_high,
        s.dual_clip,
    )


@POLICY_LOSSES.register("kl_cov", settings=KLCovSettings, ratio=True)
def kl_cov(x: PolicyLossInputs, s: KLCovSettings) -> tuple[torch.Tensor, Metrics]:
    return kl_cov_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, s.cov_ratio, s.coef)


@POLICY_LOSSES.register("vanilla", advantage_weighted=True)
def vanilla(x: PolicyLossInputs, s: NoSettings) -> tuple[torch.Tensor, Metrics]:
    return policy_gradient_loss(x.logprobs, x.advantages)


@POLICY_LOSSES.register("dppo_tv", settings=DppoTVSettings, ratio=True, advantage_weighted=True)
def dppo_tv(x: PolicyLossInputs, s: DppoTVSettings) -> tuple[torch.Tensor, Metrics]:
    args = (s.delta_low, s.delta_high, s.ratio_cap)
    return dppo_tv_loss(x.logprobs, x.old_logprobs, x.advantages, *args)


@POLICY_LOSSES.register("dppo_kl", settings=DppoKLSettings, ratio=True, advantage_weighted=True)
def dppo_kl(x: PolicyLossInputs, s: DppoKLSettings) -> tuple[torch.Tensor, Metrics]:
    args = (s.delta_low, s.delta_high, s.ratio_cap)
    return dppo_kl_loss(x.logprobs, x.old_logprobs, x.advantages, *args)


# ratio=True: no importance ratio, but the penalty anchors each step to old_logprobs, and DRO
# is an off-policy objective by design (its paper trains offline): several optimizer steps per
# batch and stale samples are its intended use.
@POLICY_LOSSES.register("dro", settings=DroSettings, ratio=True)
def dro(x: PolicyLossInputs, s: DroSettings) -> tuple[torch.Tensor, Metrics]:
    return dro_loss(x.logprobs, x.old_logprobs, x.advantages, s.beta)
