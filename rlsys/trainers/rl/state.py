"""The run's state, shared by the controller and the parts it delegates to.

``RunState`` is one object for the whole run: the controller steps it, ``Recovery`` saves,
restores and rewinds it, ``RolloutScaler`` resizes the rollout pool under it. A restore or a
recovery rebuilds its parts in place (``reset``), so every holder keeps seeing the live run.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.data.sampler import PromptSampler
from rlsys.pipeline import Pipeline


@dataclass
class RunTotals:
    """Running totals for summary.json."""

    steps: int = 0
    samples: int = 0  # generated and scored
    response_tokens: int = 0
    eval_s: float = 0.0  # wall seconds spent evaluating (not counted in throughput)
    eval_history: list[dict] = field(default_factory=list)
    accuracy_before: float | None = None  # eval at step 0
    train_wall_s: float = 0.0  # wall seconds of training before this process (resumed runs)
    nonfinite_steps: int = 0  # steps with an optimizer step skipped for a non-finite value
    nonfinite_run: int = 0  # of those, in a row up to the latest step
    scale_events: list[dict] = field(default_factory=list)  # pool resizes: step, pool, from, to


@dataclass
class RunState:
    """The policy version, the totals, and the live parts that carry the run (buffer,
    sampler, pipeline of loops)."""

    buffer: StreamingBuffer
    sampler: PromptSampler
    pipeline: Pipeline
    version: int = 0  # the policy version the engines hold (or will, mid-update)
    totals: RunTotals = field(default_factory=RunTotals)
    drawn: int = 0  # prompts drawn by the end of the previous step
    filtered: int = 0  # samples filtered by the end of the previous step
    clock: float = field(default_factory=time.perf_counter)  # training time counts from here
    # Held from a policy update until its weights are in the engines, so a replaced or added
    # rollout worker is sent weights that match ``version``.
    weights_lock: threading.RLock = field(default_factory=threading.RLock)

    def reset(self, buffer: StreamingBuffer, sampler: PromptSampler, pipeline: Pipeline) -> None:
        """Start over with fresh parts (then a checkpoint may load into them)."""
        self.buffer, self.sampler, self.pipeline = buffer, sampler, pipeline
        self.version = 0
        self.totals = RunTotals()
        self.drawn = self.filtered = 0
        self.clock = time.perf_counter()

    def elapsed(self) -> float:
        """Wall seconds of training, this process's and those before a resume."""
        return self.totals.train_wall_s + time.perf_counter() - self.clock
