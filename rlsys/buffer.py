"""The streaming buffer between scoring and the learner.

Groups enter with the policy version that generated them; a group older than
``max_staleness`` versions is refused (counted as stale), a group the filter rejects is
counted as filtered. ``max_staleness=0`` is synchronous on-policy training.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from rlsys.types import RolloutGroup

GroupFilter = Callable[[RolloutGroup], bool]


def has_reward_variance(group: RolloutGroup) -> bool:
    """False for a group whose rewards are all equal: its group-relative advantages are 0."""
    rewards = [s.reward for s in group.samples]
    return max(rewards) > min(rewards)


@dataclass
class BufferStats:
    """Sample counts since the start of the run."""

    admitted: int = 0
    released: int = 0
    dropped_stale: int = 0
    dropped_filtered: int = 0


class StreamingBuffer:
    """A FIFO of complete groups with a staleness bound and a filter hook."""

    def __init__(self, max_staleness: int, group_filter: GroupFilter | None = None) -> None:
        self.max_staleness = max_staleness
        self.group_filter = group_filter
        self._groups: deque[RolloutGroup] = deque()
        self.stats = BufferStats()

    def _drop_if_stale(self, group: RolloutGroup, policy_version: int) -> bool:
        """Count ``group`` as stale and return True if it lags more than the bound."""
        if policy_version - group.version <= self.max_staleness:
            return False
        self.stats.dropped_stale += len(group.samples)
        return True

    def put(self, group: RolloutGroup, policy_version: int) -> bool:
        """Admit ``group`` unless it is too stale or filtered; returns whether it was kept."""
        size = len(group.samples)
        if self._drop_if_stale(group, policy_version):
            return False
        if self.group_filter is not None and not self.group_filter(group):
            self.stats.dropped_filtered += size
            return False
        self._groups.append(group)
        self.stats.admitted += size
        return True

    def take(self, max_groups: int, policy_version: int) -> list[RolloutGroup]:
        """Up to ``max_groups`` groups, oldest first, re-checking staleness at release."""
        out = []
        while self._groups and len(out) < max_groups:
            group = self._groups.popleft()
            if self._drop_if_stale(group, policy_version):
                continue
            out.append(group)
            self.stats.released += len(group.samples)
        return out

    def drop_stale(self, policy_version: int) -> int:
        """Drop (and count) queued groups too old for ``policy_version``; returns how many."""
        before = len(self._groups)
        self._groups = deque(g for g in self._groups if not self._drop_if_stale(g, policy_version))
        return before - len(self._groups)

    def __len__(self) -> int:
        return len(self._groups)
