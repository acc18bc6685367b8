"""The asynchronous streaming pipeline: prompt feeding, rollout, scoring and the buffer as
concurrent loops (see ``Pipeline``); the learner is the controller's own thread."""

from rlsys.pipeline.pipeline import Pipeline
from rlsys.pipeline.sides import RolloutSide, ScoringSide

__all__ = ["Pipeline", "RolloutSide", "ScoringSide"]
