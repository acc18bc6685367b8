"""Processor sharing for the simulator: stages that share a machine's cores slow each other
down (``StageCosts.host_cores``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable


class SharedCores:
    """Processor sharing: running jobs share ``count`` cores equally, none faster than one
    core (``count`` 0: unlimited, every job at full speed). A job is ``seconds`` of work at full
    speed; ``done`` runs when it is finished."""

    def __init__(
        self,
        clock: Callable[[], float],
        schedule: Callable[[float, Callable[[], None]], None],
        count: float,
    ) -> None:
        self.clock, self.schedule, self.count = clock, schedule, count
        self._left: dict[int, float] = {}  # job -> seconds of work left at full speed
        self._done: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._last = 0.0  # when ``_left`` was last brought up to date
        self._epoch = 0  # invalidates the completion events scheduled before a change

    def _rate(self) -> float:
        if not self.count or len(self._left) <= self.count:
            return 1.0
        return self.count / len(self._left)

    def _advance(self) -> None:
        spent = (self.clock() - self._last) * self._rate()
        for job in self._left:
            self._left[job] -= spent
        self._last = self.clock()

    def start(self, seconds: float, done: Callable[[], None]) -> int:
        self._advance()
        job = next(self._ids)
        self._left[job], self._done[job] = max(seconds, 0.0), done
        self._reschedule()
        return job

    def stop(self, job: int) -> float:
        """Take ``job`` off the cores unfinished; returns the seconds of its work left."""
        self._advance()
        left = self._left.pop(job)
        del self._done[job]
        self._reschedule()
        return max(left, 0.0)

    def _reschedule(self) -> None:
        self._epoch += 1
        if self._left:
            job = min(self._left, key=self._left.__getitem__)
            epoch = self._epoch
            delay = max(self._left[job], 0.0) / self._rate()
            self.schedule(delay, lambda: self._finish(job, epoch))

    def _finish(self, job: int, epoch: int) -> None:
        if epoch != self._epoch:
            return
        self._advance()
        self._left.pop(job)
        done = self._done.pop(job)
        self._reschedule()
        done()
