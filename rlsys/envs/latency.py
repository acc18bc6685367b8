"""A tool with a fixed latency, for measuring rollout scheduling (``task.env.name=latency``).

Every model turn is a tool call that sleeps ``latency_s`` plus a uniform jitter of up to
``jitter_s`` either way (drawn from a stream seeded by ``seed``, the prompt and the
trajectory's place among the prompt's, so two runs over the same prompts see the same
latencies turn by turn, whatever order the turns are scheduled in) and answers `` ok``; the
trajectory ends after ``turns`` steps (or earlier, when the model ends its reply). Reward 0:
it measures time, not skill (``scripts/bench_tools.py``). A straggler (probability
``tail_p``) takes ``tail_s`` instead. All of these are its settings (``LatencySettings``:
``task.env.args={latency_s: 0.05, turns: 2}``).
"""

from __future__ import annotations

import collections
import random
import threading
import time
from dataclasses import dataclass

from rlsys.config.env import EnvConfig
from rlsys.envs.base import StepResult
from rlsys.envs.registry import ENVS
from rlsys.types import Prompt


class LatencyEpisode:
    """One trajectory's slow tool."""

    def __init__(self, rng: random.Random, factory: Latency) -> None:
        self.rng, self.factory = rng, factory
        self.steps = 0

    def step(self, action: str) -> StepResult:
        s = self.factory.settings
        latency = s.latency_s + self.rng.uniform(-s.jitter_s, s.jitter_s)
        if self.rng.random() < s.tail_p:  # a straggler
            latency = s.tail_s
        time.sleep(max(0.0, latency))
        self.steps += 1
        if self.steps >= s.turns:
            return StepResult(done=True, tool_call=True)
        return StepResult(" ok\n", tool_call=True)


@dataclass(frozen=True)
class LatencySettings:
    """``task.env.args`` of the latency environment."""

    latency_s: float = 0.2  # seconds a tool call sleeps
    jitter_s: float = 0.05  # plus a uniform jitter of up to this either way
    turns: int = 3  # the trajectory ends after this many tool calls
    seed: int = 0  # seeds the latency streams
    tail_p: float = 0.0  # probability that a call is a straggler
    tail_s: float = 0.0  # a straggler's latency

    def __post_init__(self) -> None:
        for key in ("latency_s", "jitter_s", "tail_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 0")
        if self.turns < 1:
            raise ValueError(f"turns={self.turns} must be >= 1")
        if not 0 <= self.tail_p <= 1:
            raise ValueError(f"tail_p={self.tail_p} must be in [0, 1]")


@ENVS.register("latency", settings=LatencySettings)
class Latency:
    """Makes latency episodes (defaults: 0.2 s +- 0.05 s, 3 steps); with ``tail_p`` > 0 a
    step is a straggler taking ``tail_s`` with that probability."""

    stop = ["\n"]  # one call per line

    def __init__(self, cfg: EnvConfig | None = None, settings: LatencySettings | None = None):
        self.settings = settings or LatencySettings()
        self._made: collections.Counter = collections.Counter()  # episodes made per prompt
        self._lock = threading.Lock()  # rollout loops make episodes from several threads

    def __call__(self, prompt: Prompt) -> LatencyEpisode:
        with self._lock:
            self._made[prompt.uid] += 1
            stream = f"{self.settings.seed}/{prompt.uid}/{self._made[prompt.uid]}"
        return LatencyEpisode(random.Random(stream), self)

    def demonstration(self, prompt: Prompt) -> list[tuple[str, bool]]:
        return [
            segment
            for _ in range(self.settings.turns - 1)
            for segment in (("go\n", True), (" ok\n", False))
        ] + [("go", True)]
