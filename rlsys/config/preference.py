"""Config of preference training: the pairs (``preference.*``), reward-model training
(``rm.*``, ``rlsys rm``) and DPO (``dpo.*``, ``rlsys dpo``). See docs/rlhf.md."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.checks import non_negative, one_of, positive
from rlsys.config.errors import ConfigError

SYNTHETIC_PAIRS = ("mistakes", "near_miss", "ranked")  # preference.synthetic
SAMPLED_PAIRS = ("mistakes", "ranked")  # the ones that sample the starting model


@dataclass
class PreferenceDataConfig:
    """``preference``: (prompt, chosen, rejected) pairs for ``rlsys rm`` and ``rlsys dpo``."""

    # .jsonl or .parquet rows with a prompt and a chosen and a rejected reply; null: pairs
    # synthesised from the task (preference.synthetic; see docs/rlhf.md).
    train_path: str | None = None
    eval_path: str | None = None  # null: hold out eval_size pairs of train_path
    eval_size: int = 256  # held-out pairs (pairwise accuracy is measured on them)
    prompt_key: str = "prompt"  # column holding the prompt text
    chosen_key: str = "chosen"  # column holding the preferred reply
    rejected_key: str = "rejected"  # column holding the other reply
    max_length: int = 256  # tokens of prompt + reply; longer pairs are skipped and counted
    synthetic_pairs: int = 4096  # synthetic pairs: training pairs drawn from the task
    # How synthetic pairs are made. "mistakes": the task's reference answer chosen over a
    # reply of the starting model its verifier marks wrong (the mistakes a policy really
    # makes); "near_miss": the reference answer over itself with a digit changed; "ranked":
    # two replies of the starting model, the one the task's reward scores higher chosen (as
    # when people rank the SFT model's samples; for graded rewards such as task=reviews).
    synthetic: str = "mistakes"
    samples_per_prompt: int = 4  # mistakes, ranked: replies sampled per prompt

    @property
    def samples_policy(self) -> bool:
        """Whether the pairs are synthesised from the starting model's sampled replies."""
        return not self.train_path and self.synthetic in SAMPLED_PAIRS

    def __post_init__(self) -> None:
        positive("preference.eval_size", self.eval_size)
        positive("preference.max_length", self.max_length)
        positive("preference.synthetic_pairs", self.synthetic_pairs)
        one_of("preference.synthetic", self.synthetic, SYNTHETIC_PAIRS)
        positive("preference.samples_per_prompt", self.samples_per_prompt)
        if self.synthetic == "ranked" and self.samples_per_prompt < 2:
            raise ConfigError(
                f"preference.samples_per_prompt={self.samples_per_prompt}: "
                "preference.synthetic=ranked compares two or more replies per prompt; use 4"
            )
        if self.eval_path and not self.train_path:
            raise ConfigError(
                "preference.eval_path is set but preference.train_path is null; give "
                "preference.train_path too (synthetic pairs make their own held-out split)"
            )


@dataclass
class RMConfig:
    """``rm``: Bradley-Terry reward-model training (``rlsys rm``) on the learner backend."""

    max_steps: int = 300  # optimizer steps (one batch of pairs each)
    batch_size: int = 64  # pairs per step
    lr: float = 3e-4  # peak AdamW rate (learner.optim's warm-up and schedule apply)
    eval_every: int = 50  # held-out pairwise accuracy every K steps (and at the end)

    def __post_init__(self) -> None:
        positive("rm.max_steps", self.max_steps)
        positive("rm.batch_size", self.batch_size)
        positive("rm.lr", self.lr)
        positive("rm.eval_every", self.eval_every)


@dataclass
class DPOConfig:
    """``dpo``: direct preference optimisation of the policy (``rlsys dpo``) against the
    frozen starting policy, whose log-probabilities are computed once and cached."""

    loss: str = "dpo"  # dpo | ipo | cdpo (conservative DPO: dpo.label_smoothing of labels flipped)
    beta: float = 0.1  # strength of the KL tie to the reference (IPO: its tau)
    label_smoothing: float = 0.0  # cdpo only: the assumed fraction of flipped labels, < 0.5
    # RPO: + nll_coef x the chosen reply's negative log-likelihood per token, which keeps DPO
    # from lowering the likelihood of both replies (the RLHF example's DPO stage, seeds 0-2:
    # gain +0.39 / +0.42 / +0.67 without it, +0.68 / +0.95 / +0.91 with 1.0; docs/rlhf.md).
    # 0: plain DPO / IPO / cDPO
    nll_coef: float = 1.0
    max_steps: int = 200  # optimizer steps (one batch of pairs each)
    batch_size: int = 64  # pairs per step
    lr: float = 1e-4  # peak AdamW rate (learner.optim's warm-up and schedule apply)
    eval_every: int = 50  # held-out pairwise and task accuracy every K steps (and at the end)

    def __post_init__(self) -> None:
        positive("dpo.beta", self.beta)
        non_negative("dpo.label_smoothing", self.label_smoothing)
        if self.label_smoothing >= 0.5:
            raise ConfigError(
                f"dpo.label_smoothing={self.label_smoothing} must be < 0.5 (at 0.5 the labels "
                "carry no information); use e.g. 0.1"
            )
        if self.label_smoothing > 0 and self.loss != "cdpo":
            raise ConfigError(
                f"dpo.label_smoothing={self.label_smoothing} only applies to dpo.loss=cdpo, "
                f"not dpo.loss={self.loss}; set dpo.loss=cdpo or dpo.label_smoothing=0"
            )
        non_negative("dpo.nll_coef", self.nll_coef)
        positive("dpo.max_steps", self.max_steps)
        positive("dpo.batch_size", self.batch_size)
        positive("dpo.lr", self.lr)
        positive("dpo.eval_every", self.eval_every)
