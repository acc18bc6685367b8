"""The asynchronous streaming pipeline: prompt feeding, rollout, scoring and the buffer as
concurrent loops (see ``Pipeline``); the learner is the controller's own thread."""

from rlsys.pipeline.pipeline import Pipeline

__all__ = ["Pipeline"]
