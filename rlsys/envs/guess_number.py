"""Guess the number: a small text game. The model guesses; the game answers ``higher`` or
``lower`` until the guess is right or the turns run out (reward 1 for finding it)."""

from __future__ import annotations

from rlsys.config.env import EnvConfig
from rlsys.envs.base import StepResult
from rlsys.envs.registry import ENVS
from rlsys.rewards.registry import numbers_in
from rlsys.types import Prompt


class GuessEpisode:
    def __init__(self, secret: int) -> None:
        self.secret = secret

    def step(self, action: str) -> StepResult:
        numbers = numbers_in(action)
        if not numbers:
            return StepResult(" say a number\n", tool_error=True)
        guess = float(numbers[-1])
        if guess == self.secret:
            return StepResult(reward=1.0, done=True, correct=True)
        return StepResult(" higher\n" if guess < self.secret else " lower\n", correct=False)


@ENVS.register("guess_number")
class GuessNumber:
    """Makes games from prompts whose answer is the secret; demonstrates binary search
    over ``meta["low"]..meta["high"]``."""

    stop = ["\n"]  # one guess per line

    def __init__(self, cfg: EnvConfig | None = None) -> None:
        """``cfg`` (``task.env``) has no game knobs; taken as every factory takes it."""

    def __call__(self, prompt: Prompt) -> GuessEpisode:
        return GuessEpisode(int(prompt.answer))

    def demonstration(self, prompt: Prompt) -> list[tuple[str, bool]]:
        low, high, secret = int(prompt.meta["low"]), int(prompt.meta["high"]), int(prompt.answer)
        segments: list[tuple[str, bool]] = []
        while True:
            guess = (low + high) // 2
            if guess == secret:
                segments.append((str(guess), True))
                return segments
            segments.append((f"{guess}\n", True))
            if guess < secret:
                segments.append((" higher\n", False))
                low = guess + 1
            else:
                segments.append((" lower\n", False))
                high = guess - 1
