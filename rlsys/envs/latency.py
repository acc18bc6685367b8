"""A tool with a fixed latency, for measuring rollout scheduling (``task.env.name=latency``).

Every model turn is a tool call that sleeps ``latency_s`` plus a uniform jitter of up to
``jitter_s`` either way (drawn from a stream seeded by ``seed``, the prompt and the
trajectory's place among the prompt's, so two runs over the same prompts see the same
latencies turn by turn, whatever order the turns are scheduled in) and answers `` ok``; the
trajectory ends after ``turns`` steps (or earlier, when the model ends its reply). Reward 0:
it measures time, not skill (``scripts/bench_tools.py``). A straggler (probability
``tail_p``) takes ``tail_s`` instead.
"""

from __future__ import annotations

import collections
import random
import threading
import time

from rlsys.config.env import EnvConfig
from rlsys.envs.base import StepResult
from rlsys.types import Prompt


class LatencyEpisode:
    """One trajectory's slow tool."""

    def __init__(self, rng: random.Random, factory: Latency) -> None:
        self.rng, self.factory = rng, factory
        self.steps = 0

    def step(self, action: str) -> StepResult:
        f = self.factory
        latency = f.latency_s + self.rng.uniform(-f.jitter_s, f.jitter_s)
        if self.rng.random() < f.tail_p:  # a straggler
            latency = f.tail_s
        time.sleep(max(0.0, latency))
        self.steps += 1
        if self.steps >= f.turns:
            return StepResult(done=True, tool_call=True)
        return StepResult(" ok\n", tool_call=True)


class Latency:
    """Makes latency episodes (defaults: 0.2 s +- 0.05 s, 3 steps); with ``tail_p`` > 0 a
    step is a straggler taking ``tail_s`` with that probability."""

    stop = ["\n"]  # one call per line

    def __init__(
        self,
        cfg: EnvConfig | None = None,  # the run's task.env (unused: the knobs below are fixed)
        *,
        latency_s: float = 0.2,
        jitter_s: float = 0.05,
        turns: int = 3,
        seed: int = 0,
        tail_p: float = 0.0,
        tail_s: float = 0.0,
    ) -> None:
        self.latency_s, self.jitter_s, self.turns, self.seed = latency_s, jitter_s, turns, seed
        self.tail_p, self.tail_s = tail_p, tail_s
        self._made: collections.Counter = collections.Counter()  # episodes made per prompt
        self._lock = threading.Lock()  # rollout loops make episodes from several threads

    def __call__(self, prompt: Prompt) -> LatencyEpisode:
        with self._lock:
            self._made[prompt.uid] += 1
            stream = f"{self.seed}/{prompt.uid}/{self._made[prompt.uid]}"
        return LatencyEpisode(random.Random(stream), self)

    def demonstration(self, prompt: Prompt) -> list[tuple[str, bool]]:
        return [
            segment for _ in range(self.turns - 1) for segment in (("go\n", True), (" ok\n", False))
        ] + [("go", True)]
