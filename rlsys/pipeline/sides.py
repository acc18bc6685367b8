"""What the pipeline is given: its rollout side (engines, the task's encoding and groups, how
to sample) and its scoring side (rewards, shaping, reference log-probabilities). The
controller builds both from its pools, collector and recipe; tests build them from fakes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlsys.buffer.replay import ReplayStore
from rlsys.config.tree import TreeConfig
from rlsys.envs.rollout import EpisodeRunner
from rlsys.pipeline.rollout import BuildGroups, GenerateOn, ReplaceWorker
from rlsys.types import Prompt, RolloutGroup, Sample, SamplingParams, TrainBatch

# prompts -> (the prompts that fit, their token ids)
Encode = Callable[[list[Prompt]], tuple[list[Prompt], list[list[int]]]]


@dataclass(frozen=True)
class RolloutSide:
    """How the rollout loops turn a request of prompts into complete, unscored groups."""

    encode: Encode
    generate_on: GenerateOn  # one generation call on one worker
    abort: Callable[[], None]  # make every worker's running call return soon
    num_workers: int
    build_groups: BuildGroups
    sampling: SamplingParams
    prompts_per_request: int | None = None  # None: a batch spread over the workers
    seed: int = 0
    greedy_baseline: bool = False  # ReMax: one greedy reply per prompt as well
    partial: bool = False  # samples a weight update aborts go on under the new weights
    replace_worker: ReplaceWorker | None = None  # restart a dead worker (then retry)
    episodes: EpisodeRunner | None = None  # a multi-turn task: trajectories, not replies
    tree: TreeConfig | None = None  # tree rollouts: a group's samples share segments
    end_ids: frozenset[int] = frozenset()  # tokens ending a reply (EOS, rollout.stop_token_ids)


@dataclass(frozen=True)
class ScoringSide:
    """What the scoring loop does to each complete group before it is buffered."""

    score: Callable[[list[RolloutGroup]], None]  # rewards (and correctness) in place
    shape: Callable[[list[Sample]], float]  # overlong shaping; returns the mean penalty
    reference: Callable[[TrainBatch], np.ndarray] | None = None  # reference log-probabilities
    pad_id: int = 0
    replay: ReplayStore | None = None  # successes put into all-wrong groups (buffer.replay)
