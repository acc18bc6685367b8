"""The streaming buffer between scoring and the learner, with admission control.

Every group carries the policy version that generated it (its oldest token). A group more
than ``max_staleness`` versions behind the learner is dropped as stale; a group the filter
rejects (DAPO dynamic sampling) is dropped as filtered. ``max_staleness=0`` is synchronous
on-policy training, 1 is one-step-off, more is fully asynchronous.

Admission control keeps generation from producing samples the bound would throw away: the
prompt feeder ``reserve``s groups before issuing prompts, and a reservation is granted only
while the groups issued and not dropped stay within ``(steps done + max_staleness + 1) x
batch`` -- so in-flight plus buffered groups never exceed about ``(max_staleness + 1) x
batch``, and in synchronous mode the next batch is issued only once the learner's new weights
are in the engines. Dropped groups free their slot (filtered ones only up to
``draw_rounds`` prompts per batch slot, DAPO's ``max_sampling_rounds``).

Everything is counted in samples for the run's accounting: issued + replayed = trained +
dropped, per reason (see ``DROP_REASONS``; replayed samples are successes of earlier groups
that the replay store put into all-wrong ones, each displacing a generated sample, which is
dropped as ``replaced``). All methods are thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rlsys.types import RolloutGroup

GroupFilter = Callable[[RolloutGroup], bool]

# Why an issued sample was never trained on:
#   stale            more than max_staleness versions behind the learner
#   filtered         its group failed the filter (e.g. no reward variance)
#   failed           its generation or scoring raised
#   prompt_too_long  the prompt exceeded task.max_prompt_tokens (never generated)
#   unused           generated or in flight when the run ended
#   replaced         its all-wrong group took a replayed success in its place (buffer.replay)
DROP_REASONS = ("stale", "filtered", "failed", "prompt_too_long", "unused", "replaced")


def has_reward_variance(group: RolloutGroup) -> bool:
    """False for a group whose rewards are all equal: its group-relative advantages are 0."""
    rewards = [s.reward for s in group.samples]
    return max(rewards) > min(rewards)


@dataclass
class BufferStats:
    """Counts since the start of the run (samples unless named groups)."""

    issued: int = 0  # samples of every reserved group
    admitted: int = 0  # entered the queue
    released: int = 0  # handed to the learner
    replayed: int = 0  # admitted from the replay store, not generated for their group
    dropped: Counter = field(default_factory=Counter)  # reason -> samples

    @property
    def dropped_stale(self) -> int:
        return self.dropped["stale"]

    @property
    def dropped_filtered(self) -> int:
        return self.dropped["filtered"]


class StreamingBuffer:
    """A FIFO of complete groups with a staleness bound, a filter hook and admission control.

    ``batch_size`` groups make one learner batch; every group has ``group_size`` samples.
    ``max_groups`` caps the groups ever issued (``trainer.max_samples``), ``max_steps`` the
    learner steps they are issued for (``trainer.total_steps``)."""

    def __init__(
        self,
        batch_size: int,
        group_size: int,
        max_staleness: int,
        group_filter: GroupFilter | None = None,
        draw_rounds: int = 1,
        max_groups: int | None = None,
        max_steps: int | None = None,
    ) -> None:
        self.batch_size, self.group_size = batch_size, group_size
        self.max_staleness = max_staleness
        self.group_filter = group_filter
        self.draw_rounds = draw_rounds
        self.max_groups = max_groups
        self.max_steps = max_steps
        self.stats = BufferStats()
        self._groups: deque[RolloutGroup] = deque()
        self._cond = threading.Condition()
        self._version = 0  # the learner's policy version
        self._steps = 0  # learner steps done (a step that trains nothing still counts)
        self._issued = 0  # groups reserved
        self._in_flight = 0  # reserved, not yet queued or dropped
        # batch slots the learner's steps left empty (a take short of the batch size): those
        # steps are over, so their slots are never issued again
        self._short = 0
        self._dropped = Counter()  # reason -> groups
        self._closed = False
        self._paused = False  # no reservations granted (a checkpoint is being taken)

    # ---- the feeder's side ---------------------------------------------------------------

    def _capacity(self) -> int:
        steps = self._steps + self.max_staleness + 1
        if self.max_steps is not None:
            steps = min(steps, self.max_steps)
        window = steps * self.batch_size
        live = self._issued - sum(self._dropped.values())
        drawn = self._issued - self._dropped["stale"]  # stale drops are refilled freely
        room = min(window - self._short - live, self.draw_rounds * window - drawn)
        if self.max_groups is not None:
            room = min(room, self.max_groups - self._issued)
        return max(room, 0)

    def reserve(self, max_groups: int) -> int:
        """Block until at least one group may be issued, then reserve up to ``max_groups``;
        returns how many (0 once the buffer is closed or the sample budget is spent)."""
        with self._cond:
            while not self._closed and (self._paused or self._no_room()):
                self._cond.wait()
            if self._closed or self._budget_spent():
                return 0
            granted = min(max_groups, self._capacity())
            self._issued += granted
            self._in_flight += granted
            self.stats.issued += granted * self.group_size
            return granted

    def _no_room(self) -> bool:
        return self._capacity() == 0 and not self._budget_spent()

    def room(self) -> int:
        """How many groups ``reserve`` would grant now without waiting: 0 while paused, closed,
        full or with the sample budget spent. (The planner's simulator drives the buffer with
        this and ``ready`` instead of blocking calls: see ``rlsys.plan.simulator``.)"""
        with self._cond:
            if self._closed or self._paused or self._budget_spent():
                return 0
            return self._capacity()

    def _budget_spent(self) -> bool:
        return self.max_groups is not None and self._issued >= self.max_groups

    def cancel(self, groups: int, reason: str) -> None:
        """``groups`` reserved groups will never arrive (dropped for ``reason``)."""
        if reason not in DROP_REASONS:
            raise ValueError(f"drop reason {reason!r} is not one of {DROP_REASONS}")
        with self._cond:
            self._in_flight -= groups
            self._count_drop(groups, reason)
            self._cond.notify_all()

    def _count_drop(self, groups: int, reason: str) -> None:
        self._dropped[reason] += groups
        self.stats.dropped[reason] += groups * self.group_size

    # ---- the scoring side ----------------------------------------------------------------

    def screen(self, group: RolloutGroup) -> bool:
        """Check an arriving (reserved) group against the staleness bound and the filter;
        a rejected group is dropped and counted. A kept one must then be ``push``ed."""
        with self._cond:
            reason = None
            if self._is_stale(group):
                reason = "stale"
            elif self.group_filter is not None and not self.group_filter(group):
                reason = "filtered"
            if reason is None:
                return True
            self._in_flight -= 1
            self._count_drop(1, reason)
            self._cond.notify_all()
            return False

    def push(self, group: RolloutGroup) -> None:
        """Queue a screened group for the learner (its replayed samples counted as such)."""
        replayed = sum(s.replayed for s in group.samples)
        with self._cond:
            self._in_flight -= 1
            self._groups.append(group)
            self.stats.admitted += len(group.samples)
            self.stats.replayed += replayed
            self.stats.dropped["replaced"] += replayed
            self._cond.notify_all()

    def put(self, group: RolloutGroup) -> bool:
        """``screen`` then ``push``; returns whether the group was kept."""
        if not self.screen(group):
            return False
        self.push(group)
        return True

    # ---- the learner's side --------------------------------------------------------------

    def _is_stale(self, group: RolloutGroup) -> bool:
        return self._version - group.version > self.max_staleness

    def _drop_stale(self) -> None:
        kept = deque(g for g in self._groups if not self._is_stale(g))
        self._count_drop(len(self._groups) - len(kept), "stale")
        self._groups = kept

    def _starved(self) -> bool:
        """Nothing more can arrive until the learner moves on."""
        return self._in_flight == 0 and self._capacity() == 0

    def _take_ready(self, max_groups: int) -> bool:
        return self._closed or len(self._groups) >= max_groups or self._starved()

    def ready(self, max_groups: int) -> bool:
        """Whether ``take(max_groups)`` would return now without waiting."""
        with self._cond:
            return self._take_ready(max_groups)

    def take(self, max_groups: int) -> list[RolloutGroup]:
        """Up to ``max_groups`` groups, oldest first. Blocks until that many are queued, or
        no more can arrive before the learner's next step (then fewer, possibly none), or the
        buffer is closed."""
        with self._cond:
            while not self._take_ready(max_groups):
                self._cond.wait()
            self._drop_stale()
            out = [self._groups.popleft() for _ in range(min(max_groups, len(self._groups)))]
            self._short += max(min(max_groups, self.batch_size) - len(out), 0)
            self.stats.released += sum(len(g.samples) for g in out)
            self._cond.notify_all()
            return out

    def step_done(self, policy_version: int) -> None:
        """The learner finished a step and its engines hold ``policy_version``: admit the
        next batch's worth of groups, drop queued ones the new version makes stale."""
        with self._cond:
            self._steps += 1
            self._version = policy_version
            self._drop_stale()
            self._cond.notify_all()

    def exhausted(self) -> bool:
        """No group will ever arrive again (the sample budget is spent or the buffer closed)
        and every issued group has been taken or dropped."""
        with self._cond:
            done = self._budget_spent() or self._closed
            return done and self._in_flight == 0 and not self._groups

    # ---- checkpoints ---------------------------------------------------------------------

    def pause(self) -> None:
        """Grant no reservations until ``resume`` (groups already issued still arrive)."""
        with self._cond:
            self._paused = True

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def wait_drained(self, timeout_s: float | None = None) -> bool:
        """Wait until no group is in flight (every reservation queued or dropped); with
        ``pause`` held, the buffer's state then stands still. False on timeout or close."""
        with self._cond:
            return (
                self._cond.wait_for(lambda: self._in_flight == 0 or self._closed, timeout=timeout_s)
                and self._in_flight == 0
            )

    def state_dict(self) -> dict:
        """Counters and queued groups (call drained: ``pause`` + ``wait_drained``)."""
        with self._cond:
            if self._in_flight:
                raise RuntimeError(
                    f"buffer.state_dict with {self._in_flight} groups in flight: pause and "
                    "wait_drained first"
                )
            return {
                "stats": {
                    "issued": self.stats.issued,
                    "admitted": self.stats.admitted,
                    "released": self.stats.released,
                    "replayed": self.stats.replayed,
                    "dropped": dict(self.stats.dropped),
                },
                "version": self._version,
                "steps": self._steps,
                "short": self._short,
                "issued": self._issued,
                "dropped": dict(self._dropped),
                "groups": list(self._groups),
            }

    def load_state_dict(self, state: dict) -> None:
        with self._cond:
            stats = state["stats"]
            self.stats = BufferStats(
                stats["issued"],
                stats["admitted"],
                stats["released"],
                stats.get("replayed", 0),  # absent from checkpoints before buffer.replay
                Counter(stats["dropped"]),
            )
            self._version, self._steps = state["version"], state["steps"]
            self._short = state.get("short", 0)  # absent from checkpoints before 2026-11-28
            self._issued, self._dropped = state["issued"], Counter(state["dropped"])
            self._groups = deque(state["groups"])
            self._in_flight = 0
            self._cond.notify_all()

    # ---- the end of a run ----------------------------------------------------------------

    def close(self) -> None:
        """Stop granting reservations and wake every waiter."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def drop_queued(self, reason: str = "unused") -> int:
        """Drop every queued group (at the end of a run); returns how many."""
        with self._cond:
            count = len(self._groups)
            self._count_drop(count, reason)
            self._groups.clear()
            return count

    @property
    def in_flight(self) -> int:
        """Groups reserved but not yet queued or dropped."""
        with self._cond:
            return self._in_flight

    def accounting(self) -> dict:
        """Samples issued, replayed, trained and dropped per reason, and whether they balance
        (every issued or replayed sample trained or dropped, none in flight or queued)."""
        with self._cond:
            dropped = {reason: self.stats.dropped[reason] for reason in DROP_REASONS}
            return {
                "samples_issued": self.stats.issued,
                "samples_trained": self.stats.released,
                "samples_replayed": self.stats.replayed,
                "samples_dropped": dropped,
                "samples_in_flight": self._in_flight * self.group_size,
                "samples_queued": sum(len(g.samples) for g in self._groups),
                "balanced": self.stats.issued + self.stats.replayed
                == self.stats.released + sum(dropped.values())
                and self._in_flight == 0
                and not self._groups,
            }

    def __len__(self) -> int:
        with self._cond:
            return len(self._groups)
