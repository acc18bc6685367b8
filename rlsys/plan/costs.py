"""The cost model: seconds each pipeline stage takes for a given amount of work.

Every stage is linear in the work it does, with a fixed cost per call:

* generation, one call on one engine with ``S`` sequences of ``P`` prompts::

      gen_call_s + gen_prompt_token_s x P x prompt_tokens + gen_sequence_s x S
        + gen_step_s x (longest reply) + gen_token_s x (tokens generated)

  ``gen_step_s`` is the batch behaviour: engines decode every running sequence in lock-step,
  so a call lasts as many decode steps as its longest reply (on a GPU, a decode step reads
  the weights once whatever the batch: memory-bound), and each token adds ``gen_token_s``
  (attention over the cache, sampling).
* a learner pass over ``B`` samples of ``T`` tokens (prompt + reply) on ``R`` data-parallel
  ranks: ``call_s + (sample_s x B + token_s x T) / R``, training adding a gradient all-reduce
  of ``grad_bytes`` per optimizer step (ring: ``2 (R - 1) / R x grad_bytes / bandwidth``);
* weight sync: ``sync_call_s + sync_byte_s x bytes``;
* scoring: ``score_group_s`` per group (reward function and, when a KL term needs it, the
  reference forward);
* the controller's own work per learner step (batching, advantages, metrics),
  ``step_overhead_s``, and between steps (logging) ``between_steps_s``; with engines that sleep while colocated learners train,
  ``engine_sleep_s`` and ``engine_wake_s`` per step; ``run_overhead_s`` once per run (the
  pipeline starting and stopping inside the measured training wall time);
* ``host_cores``: where the pools share a machine's cores (CPU runs), every running stage is
  a job on them and they are shared equally (processor sharing): three busy stages on two
  cores each run at two thirds of their speed. 0 (GPU pools on their own devices): no
  contention.

Constants come from ``calibrate`` (measured runs) or ``hardware`` (published figures); the
defaults are zero (free) so that a constant nobody measured never invents a cost.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path


class CostsError(ValueError):
    """A cost-model file or value that cannot be used (the message names the key)."""


@dataclass(frozen=True)
class StageCosts:
    """Seconds per unit of work, per rollout engine and per learner rank."""

    # generation, per call on one engine
    gen_call_s: float = 0.0
    gen_prompt_token_s: float = 0.0  # prefill, once per prompt (the n samples share it)
    gen_sequence_s: float = 0.0
    gen_step_s: float = 0.0  # per decode step of the call (its longest reply)
    gen_token_s: float = 0.0  # per generated token
    # learner forward for the old log-probabilities, per step
    logprob_call_s: float = 0.0
    logprob_sample_s: float = 0.0
    logprob_token_s: float = 0.0
    # one training pass (epoch), per step
    train_call_s: float = 0.0
    train_sample_s: float = 0.0
    train_token_s: float = 0.0
    grad_bytes: float = 0.0  # bytes all-reduced per optimizer step (data-parallel ranks > 1)
    allreduce_bytes_per_s: float = 0.0  # ring bus bandwidth between ranks; 0: free
    # weight sync, per step
    sync_call_s: float = 0.0
    sync_byte_s: float = 0.0
    # scoring, per group
    score_group_s: float = 0.0
    # the controller
    step_overhead_s: float = 0.0  # inside the learner's step (perf/step_s)
    between_steps_s: float = 0.0  # after a step, before the next (logging, scaling checks)
    engine_sleep_s: float = 0.0
    engine_wake_s: float = 0.0
    run_overhead_s: float = 0.0
    # cores the pools' processes share (a CPU machine: rollout workers, learner, controller);
    # 0: each pool has its own devices, nothing contends
    host_cores: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int | float) or value < 0 or value != value:
                raise CostsError(f"cost {f.name}={value!r} must be a number >= 0")

    def generation_s(
        self, prompts: int, sequences: int, prompt_tokens: float, longest: int, tokens: int
    ) -> float:
        """One generation call on one engine."""
        return (
            self.gen_call_s
            + self.gen_prompt_token_s * prompts * prompt_tokens
            + self.gen_sequence_s * sequences
            + self.gen_step_s * longest
            + self.gen_token_s * tokens
        )

    def logprobs_s(self, samples: int, tokens: float, ranks: int) -> float:
        """The learner's forward pass for the old log-probabilities."""
        per_rank = (self.logprob_sample_s * samples + self.logprob_token_s * tokens) / ranks
        return self.logprob_call_s + per_rank

    def train_s(
        self, samples: int, tokens: float, ranks: int, epochs: int, mini_batches: int
    ) -> float:
        """``epochs`` training passes, ``mini_batches`` optimizer steps each."""
        per_rank = (self.train_sample_s * samples + self.train_token_s * tokens) / ranks
        allreduce = 0.0
        if ranks > 1 and self.allreduce_bytes_per_s > 0:
            allreduce = 2 * (ranks - 1) / ranks * self.grad_bytes / self.allreduce_bytes_per_s
        return epochs * (self.train_call_s + per_rank + mini_batches * allreduce)

    def weight_sync_s(self, num_bytes: float) -> float:
        return self.sync_call_s + self.sync_byte_s * num_bytes

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict, source: str = "costs") -> StageCosts:
        """Costs from a dict; an unknown key is an error naming it and the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise CostsError(
                f"{source}: unknown cost key(s) {unknown}; known keys: {sorted(known)}"
            )
        return cls(**values)


def read_costs(path: str | Path) -> tuple[StageCosts, dict]:
    """A calibration file (what ``rlsys plan calibrate`` writes): its costs and the rest
    (what was measured, which constants the runs identified)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CostsError(
            f"--costs {path}: cannot read a calibration file ({exc}); write one with "
            "`rlsys plan calibrate RUN_DIR... --out costs.json`"
        ) from exc
    if not isinstance(data, dict) or "costs" not in data:
        raise CostsError(f"--costs {path}: no 'costs' object; is it from `rlsys plan calibrate`?")
    return StageCosts.from_dict(data["costs"], f"--costs {path}"), data
