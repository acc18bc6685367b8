"""Configs of what makes a run survive: checkpoints, resume and failure handling."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.checks import non_negative, positive
from rlsys.config.errors import ConfigError


@dataclass
class CheckpointConfig:
    """Resumable checkpoints under ``<run_dir>/checkpoints/step_<N>`` (see docs/checkpoints.md)."""

    every: int = 50  # save every K learner steps (0: only at exit and on SIGTERM)
    keep: int = 2  # complete checkpoints kept; older ones are deleted after a new one lands
    at_exit: bool = True  # also save when the run ends (steps done, a budget, SIGTERM)
    # Also write the policy as a Hugging Face directory inside every checkpoint (``hf/``);
    # the final policy is always exported to checkpoints/final, and `rlsys export` turns any
    # checkpoint into one on demand.
    save_hf: bool = False

    def __post_init__(self) -> None:
        non_negative("checkpoint.every", self.every)
        positive("checkpoint.keep", self.keep)


@dataclass
class FaultConfig:
    """How many failures a run absorbs before it stops with an error."""

    # Rollout worker processes restarted (over the whole run); the dead worker's request is
    # re-issued to the new one after it received the current weights.
    max_rollout_restarts: int = 3
    # Learner (or critic) group restarts from the last checkpoint (over the whole run).
    max_learner_restarts: int = 2
    # Optimizer steps skipped for a non-finite loss or gradient norm, in a row, that stop the
    # run (a diverged run rarely recovers; resume from an earlier checkpoint with a lower lr).
    max_nonfinite_steps: int = 3

    def __post_init__(self) -> None:
        non_negative("fault.max_rollout_restarts", self.max_rollout_restarts)
        non_negative("fault.max_learner_restarts", self.max_learner_restarts)
        positive("fault.max_nonfinite_steps", self.max_nonfinite_steps)


def check_resume(resume: str | None) -> None:
    """``resume`` is null, ``auto``, or a path (a run directory or one checkpoint in it)."""
    if resume is not None and not str(resume).strip():
        raise ConfigError(
            "resume='' is blank; use resume=auto (the latest run in run.output_dir), a run "
            "directory or a checkpoint directory, or leave it null"
        )
