"""Config of the streaming buffer between scoring and the learner, and of its replay store
of rare successes (rlsys/buffer/streaming.py, rlsys/buffer/replay.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsys.config.checks import positive
from rlsys.config.errors import ConfigError

MAX_STALENESS = 16  # beyond this, samples are too off-policy for any correction here


@dataclass
class ReplayConfig:
    """``buffer.replay``: keep correct samples of prompts the policy rarely solves and put
    them into later groups of those prompts that came back all wrong (ARPO's replay;
    rlsys/buffer/replay.py, docs/sampling.md). Replayed samples keep their behaviour log-probs and
    policy versions, so the off-policy correction (``algorithm.off_policy``) weighs them."""

    enabled: bool = False  # on: successes of rarely solved prompts fill their all-wrong groups
    # A scored group offers its correct samples when at most this fraction of it is correct
    # (1.0: every success is kept; the store is for prompts the policy rarely solves).
    max_pass_rate: float = 0.25
    per_prompt: int = 4  # correct samples kept per prompt, the newest
    # Samples of an all-wrong group replaced by kept successes of its prompt (fewer when
    # fewer are kept); must be below rollout.n_samples.
    per_group: int = 1
    # A kept sample older than this many policy versions is forgotten: the correction cannot
    # make up for an arbitrarily old behaviour policy. A prompt comes back after an epoch
    # (train prompts / data.batch_size steps with the uniform sampler): below that, nothing
    # kept is ever replayed.
    max_age: int = 64
    max_prompts: int = 4096  # prompts with kept samples; the least recently updated go first

    def check(self) -> None:
        if not 0 < self.max_pass_rate <= 1:
            raise ConfigError(
                f"buffer.replay.max_pass_rate={self.max_pass_rate} must be in (0, 1] (the "
                "pass rate at or below which a group's successes are kept)"
            )
        for key in ("per_prompt", "per_group", "max_age", "max_prompts"):
            positive(f"buffer.replay.{key}", getattr(self, key))


@dataclass
class BufferConfig:
    """The streaming buffer between scoring and the learner."""

    # Policy versions a sample may lag the learner: 0 is synchronous on-policy training, 1
    # one-step-off (generation of the next batch overlaps training), more is fully async.
    # Generation runs ahead by at most (max_staleness + 1) x data.batch_size groups.
    max_staleness: int = 0
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.max_staleness <= MAX_STALENESS:
            raise ConfigError(
                f"buffer.max_staleness={self.max_staleness} must be in [0, {MAX_STALENESS}] "
                "(0: synchronous, 1: one-step-off, 2+: fully asynchronous)"
            )
        self.replay.check()
