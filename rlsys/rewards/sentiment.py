"""The ``sentiment`` reward: the hidden labeller of the RLHF example's task (``task=reviews``,
``rlsys.data.reviews``). Its value is the labeller's score in [-1, 1]; its verdict
(``correct``) is whether the labeller calls the review positive (score above 0)."""

from __future__ import annotations

from rlsys.data.reviews import sentiment_score
from rlsys.rewards.registry import REWARDS


@REWARDS.register("sentiment")
def sentiment(prompt: str, completion: str, metadata: dict) -> dict:
    """The labeller's score of the reply, and whether it is positive."""
    score = sentiment_score(completion)
    return {"reward": score, "correct": score > 0}
