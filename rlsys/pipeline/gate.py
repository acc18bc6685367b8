"""The gate rollout loops pass to start a request; the learner shuts it to update weights."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ABORT_RETRY_S = 0.5  # partial mode: re-send the abort while requests are still running


class RolloutGate:
    """Open: rollout loops start requests. Shut (``with gate.shut():``): no request starts, and
    the block begins once every running one has returned -- at once with ``partial`` (running
    requests are aborted, their prefixes continue under the new weights), else after they
    finish on the old weights. ``stop`` shuts it for good."""

    def __init__(self, abort: Callable[[], None], partial: bool) -> None:
        self.abort, self.partial = abort, partial
        self._cond = threading.Condition()
        self._open = True
        self._shut_depth = 0  # nested ``shut`` blocks: the outermost one reopens
        self._stopped = False
        self._running = 0

    def enter(self) -> bool:
        """Wait until the gate is open and count a request as running; False once stopped
        (then nothing is counted)."""
        with self._cond:
            while not self._open and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return False
            self._running += 1
            return True

    def leave(self) -> None:
        """A request ``enter`` counted has returned."""
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    @contextmanager
    def shut(self) -> Iterator[float]:
        """Hold every rollout loop between requests for the block (a weight update); yields
        the seconds spent waiting for running requests to return. Blocks may nest (engines
        asleep around a weight update); the gate reopens when the outermost one ends."""
        start = time.perf_counter()
        with self._cond:
            self._open = False
            self._shut_depth += 1
        # An abort can reach a worker just before the request it targets starts (and is then
        # lost), so partial mode repeats it until every request has returned.
        while True:
            with self._cond:
                if not self._running:
                    break
            if self.partial:
                self.abort()
            with self._cond:
                self._cond.wait_for(lambda: not self._running, timeout=ABORT_RETRY_S)
        try:
            yield time.perf_counter() - start
        finally:
            with self._cond:
                self._shut_depth -= 1
                if not self._shut_depth and not self._stopped:
                    self._open = True
                self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        with self._cond:
            return self._stopped

    def stop(self) -> None:
        """Shut for good and abort running requests (the end of a run)."""
        with self._cond:
            self._stopped = True
            self._open = False
            running = self._running
            self._cond.notify_all()
        if running:
            self.abort()
