"""Elapsed time and ETA for the one-line-per-step console output (works in plain logs)."""

from __future__ import annotations

import time


def format_duration(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``: short enough for a log line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Wall time since start and the time left to ``total`` steps, at the mean pace of the
    steps seen so far: counted from ``start_step`` at creation when given, else from the
    first step reported (a resumed run's pace is its own)."""

    def __init__(
        self, total: int | None, start_step: int | None = None, clock=time.monotonic
    ) -> None:
        self.total = total
        self._clock = clock
        self._started = clock()
        # (step, time) the pace is measured from; None: the first report sets it
        self._first = None if start_step is None else (start_step, self._started)

    def text(self, step: int) -> str:
        """``elapsed 1m05s, eta 3m10s`` (the ETA once two distinct steps were seen)."""
        now = self._clock()
        if self._first is None:
            self._first = (step, now)
        parts = [f"elapsed {format_duration(now - self._started)}"]
        first_step, first_time = self._first
        if self.total and step > first_step:
            per_step = (now - first_time) / (step - first_step)
            parts.append(f"eta {format_duration(per_step * max(self.total - step, 0))}")
        return ", ".join(parts)
