"""A pipeline loop: a daemon thread that records its busy time and hands a failure on."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

log = logging.getLogger(__name__)


class Loop:
    """Runs ``self.run()`` on a thread. ``busy()`` marks working time (the rest is idle);
    an exception reaches ``on_failure`` so the controller can stop the run and re-raise it."""

    name = "loop"

    def __init__(self, on_failure: Callable[[BaseException], None]) -> None:
        self.on_failure = on_failure
        self.busy_s = 0.0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        raise NotImplementedError

    def _main(self) -> None:
        try:
            self.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the controller, which raises it
            log.error("%s failed: %r", self.name, exc)
            self.on_failure(exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end; returns whether it did."""
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @contextmanager
    def busy(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.busy_s += time.perf_counter() - start

    def read_busy(self) -> float:
        with self._lock:
            return self.busy_s
