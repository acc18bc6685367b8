"""Config of how training prompts are drawn: uniformly by epoch, or by a curriculum."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import one_of, positive
from rlsys.config.errors import ConfigError

SAMPLERS = ("uniform", "curriculum")
SCORES = ("pass_rate", "mixed_rate")


@dataclass
class CurriculumConfig:
    """``data.curriculum``: how ``data.sampler=curriculum`` estimates pass rates and picks
    prompts (rlsys/data/curriculum.py; docs/sampling.md)."""

    # A prompt metadata key whose value groups prompts that share a pass-rate estimate (e.g.
    # "level" of the built-in arithmetic task, or a difficulty column of a dataset). null:
    # every prompt is its own group (needs prompts seen more than once: several epochs).
    bucket_key: str | None = None
    # The estimate of a bucket weighs about this many of its latest groups (older ones fade
    # geometrically), so it follows the policy as it learns.
    memory_groups: float = 16.0
    # With buckets, a prompt seen before draws its pass rate from its own groups, with its
    # bucket's estimate as a prior worth this many samples (null: the bucket's estimate alone).
    prompt_prior_samples: float | None = 2.0
    # Fraction of each draw made uniformly over all prompts, so no prompt is starved by an
    # estimate that has gone stale.
    uniform_mix: float = 0.02
    # What a prompt's draw weight estimates. pass_rate: a Beta posterior of the pass rate p,
    # weight 1 - p^n - (1-p)^n (the chance of a mixed group if samples were independent);
    # mixed_rate: a Beta posterior of the share of its groups that came back mixed, measured
    # directly (prompts of one bucket that are all right or all wrong count as such).
    score: str = "pass_rate"
    # Draw weight = score ** sharpness: 1 draws in proportion to the chance of a mixed group;
    # larger values concentrate the draw on the prompts most likely to give one.
    sharpness: float = 3.0

    def check(self) -> None:
        if self.bucket_key is not None and not self.bucket_key.strip():
            raise ConfigError(
                "data.curriculum.bucket_key is empty; name a prompt metadata key or set null"
            )
        if self.memory_groups < 1:
            raise ConfigError(
                f"data.curriculum.memory_groups={self.memory_groups} must be >= 1 (groups of "
                "a bucket its estimate remembers)"
            )
        if self.prompt_prior_samples is not None and self.prompt_prior_samples <= 0:
            raise ConfigError(
                f"data.curriculum.prompt_prior_samples={self.prompt_prior_samples} must be > 0 "
                "(null: prompts take their bucket's estimate alone)"
            )
        if not 0 <= self.uniform_mix <= 1:
            raise ConfigError(f"data.curriculum.uniform_mix={self.uniform_mix} must be in [0, 1]")
        one_of("data.curriculum.score", self.score, SCORES)
        if not 0 < self.sharpness <= 16:
            raise ConfigError(
                f"data.curriculum.sharpness={self.sharpness} must be in (0, 16] (1: draw in "
                "proportion to the chance of a mixed group; larger: favour the likeliest prompts)"
            )


@dataclass
class DataConfig:
    """How prompts are drawn for training."""

    batch_size: int = 32  # prompts per step (each gets rollout.n_samples completions)
    shuffle: bool = True  # uniform sampler: reshuffle the train split every epoch
    # uniform: every prompt once per epoch; curriculum: prompts whose estimated pass rate
    # makes a group of rollout.n_samples most likely to hold both right and wrong answers
    # (settings under data.curriculum)
    sampler: str = "uniform"
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)

    def __post_init__(self) -> None:
        positive("data.batch_size", self.batch_size)
        one_of("data.sampler", self.sampler, SAMPLERS)
        self.curriculum.check()
