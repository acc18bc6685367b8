"""Replay of rare successes: correct samples of prompts the policy seldom solves, put back
into later groups of those prompts that come back all wrong.

A GRPO group whose samples are all wrong has no reward variance: every advantage is 0 and
the group filter throws it away, so a prompt the policy solves once in many tries teaches
nothing on the tries it fails. ``ReplayStore`` keeps the correct samples of groups at or
below ``buffer.replay.max_pass_rate`` (per prompt, the newest ``per_prompt``) and, when a
later group of that prompt has no correct sample, replaces ``per_group`` of its samples
with kept ones, so the group has variance again and the success is reinforced against the
failures.

This is the replay of ARPO (Lu et al. 2025, "ARPO: End-to-End Policy Optimization for GUI
Agents with Experience Replay"): a per-task buffer of successful trajectories, one of which
replaces a sample of an all-failure group. Departures: only groups that rarely succeed
offer their successes (ARPO keeps every success); a kept sample expires after ``max_age``
policy versions; replayed samples keep their behaviour log-probabilities and versions, so
``algorithm.off_policy`` (required with replay) weighs them like any other off-policy
sample, and the run's accounting counts them as their own source (``samples_replayed``;
the generated samples they displaced are dropped as ``replaced``).

Offers are staged and reach the store at step boundaries (``commit`` from the controller),
so in synchronous mode what a group is filled with depends only on earlier steps and a
resumed run replays what the uninterrupted one did. Thread-safe: the scoring loop offers
and fills while the controller commits.
"""

from __future__ import annotations

import dataclasses
import threading

from rlsys.config.buffer import ReplayConfig
from rlsys.types import RolloutGroup, Sample


class ReplayStore:
    """Kept successes by prompt uid (the module docstring). ``offer`` and ``fill`` come from
    the scoring loop, group by group; ``commit`` from the controller at each step."""

    def __init__(self, cfg: ReplayConfig) -> None:
        self.cfg = cfg
        self._kept: dict[int, list[Sample]] = {}  # uid -> kept samples, oldest first
        self._pending: list[Sample] = []  # offered since the last commit
        self._version = 0  # the policy version at the last commit
        self._lock = threading.Lock()

    def offer(self, group: RolloutGroup) -> int:
        """Stage the correct samples of a scored ``group`` whose pass rate is at most
        ``max_pass_rate``; returns how many. Call before reward shaping (the kept reward is
        the verifier's)."""
        generated = [s for s in group.samples if not s.replayed]
        right = [s for s in generated if s.correct]
        if not right or len(right) > self.cfg.max_pass_rate * len(generated):
            return 0
        with self._lock:
            self._pending += [_copy(s) for s in right]
        return len(right)

    def fill(self, group: RolloutGroup) -> RolloutGroup:
        """``group`` with its last ``per_group`` samples replaced by kept successes of its
        prompt (the newest first) when none of its samples is correct; else ``group``."""
        if any(s.correct for s in group.samples):
            return group
        with self._lock:
            kept = self._kept.get(group.prompt.uid, [])
            chosen = [_copy(s, replayed=True) for s in reversed(kept[-self.cfg.per_group :])]
        if not chosen:
            return group
        samples = group.samples[: len(group.samples) - len(chosen)] + chosen
        return dataclasses.replace(group, samples=samples)

    def commit(self, version: int) -> None:
        """Move the staged samples into the store (in a fixed order, whatever order the
        groups were scored in), then forget samples older than ``max_age`` versions behind
        ``version``, then, beyond ``max_prompts``, the prompts whose newest success is
        oldest."""
        with self._lock:
            self._version = version
            for sample in sorted(self._pending, key=_order):
                uid = sample.prompt.uid
                self._kept[uid] = [*self._kept.get(uid, []), sample][-self.cfg.per_prompt :]
            self._pending = []
            fresh = {
                uid: [s for s in kept if not self._expired(s)] for uid, kept in self._kept.items()
            }
            by_newest = sorted(
                (uid for uid, kept in fresh.items() if kept),
                key=lambda uid: (-fresh[uid][-1].completion.version, uid),
            )
            self._kept = {uid: fresh[uid] for uid in sorted(by_newest[: self.cfg.max_prompts])}

    def _expired(self, sample: Sample) -> bool:
        return self._version - sample.completion.version > self.cfg.max_age

    def metrics(self) -> dict[str, float]:
        with self._lock:
            return {
                "buffer/replay_prompts": len(self._kept),
                "buffer/replay_kept": sum(len(v) for v in self._kept.values()),
            }

    def state_dict(self) -> dict:
        with self._lock:
            return {
                "version": self._version,
                "kept": [[uid, list(samples)] for uid, samples in self._kept.items()],
                "pending": list(self._pending),
            }

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._version = state["version"]
            self._kept = {uid: list(samples) for uid, samples in state["kept"]}
            self._pending = list(state["pending"])


def _copy(sample: Sample, replayed: bool = False) -> Sample:
    """A sample of its own (a group's later shaping and reference log-probs stay there)."""
    return dataclasses.replace(
        sample,
        ref_logprobs=None,
        reward_components=dict(sample.reward_components),
        replayed=replayed,
    )


def _order(sample: Sample) -> tuple:
    """A total order of staged samples: by prompt, policy version, then tokens."""
    completion = sample.completion
    return sample.prompt.uid, completion.version, completion.token_ids
