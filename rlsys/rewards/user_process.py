"""A user reward function (``reward.fn``) in a long-lived child process, so that nothing it
does ends the process that scores: ``os._exit`` by any name, ``sys.exit``, a segfault in C
code or a hang that holds the GIL.

The child imports the user's file (``load_user_reward``) and scores chunks of
``concurrency`` samples with ``score_many`` (its threads, its ``timeout_s``); the parent sends
each chunk over a socket and waits at most ``timeout_s`` + ``ANSWER_GRACE_S`` for the answer.
When the child dies on a chunk, that chunk is scored again one sample at a time in a fresh
child, so only the sample that ends the process scores 0 (with a counted error). A child that
does not answer in time is killed: its chunk scores 0 as timed out. The next chunk starts a
fresh child. Built-in rewards stay in the scoring process: only user code pays for this
(about 25 us per sample in chunks of 8 on a 2-core machine; a restart costs one interpreter
start, about 0.3 s, plus the file's imports).

The child's side is this module run as ``python -m rlsys.rewards.user_process SPEC FD``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection

from rlsys.config.errors import ConfigError
from rlsys.rewards.scoring import RewardOutcome, score_many

log = logging.getLogger(__name__)
START_TIMEOUT_S = 300.0  # importing the user's file (it may import torch) must end by then
ANSWER_GRACE_S = 5.0  # a chunk's answer may come this long after its calls' timeout
_CHILD = "rlsys.rewards.user_process"

Item = tuple[str, str, dict]


@dataclass
class _Failed:
    """A chunk that came back without scores: ``died`` when the child ended on it."""

    why: str
    died: bool


class _Child:
    """One running child: its process and the parent's end of its socket."""

    def __init__(self, spec: str) -> None:
        parent_end, child_end = multiprocessing.Pipe()
        # the child imports what this process would: its sys.path, in order
        path = os.pathsep.join(p for p in sys.path if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", _CHILD, spec, str(child_end.fileno())],
            stdin=subprocess.DEVNULL,
            pass_fds=(child_end.fileno(),),
            env={**os.environ, "PYTHONPATH": path},
        )
        child_end.close()
        self.conn = parent_end

    def ready(self) -> str | None:
        """None once the user's file is imported, else why the child could not start."""
        if not self.conn.poll(START_TIMEOUT_S):
            self.kill()
            return f"the reward process did not start within {START_TIMEOUT_S:.0f}s"
        try:
            error = self.conn.recv()
        except (EOFError, OSError):
            error = f"importing the file ended its process ({self.status()})"
        if error is not None:
            self.kill()
        return error

    def status(self) -> str:
        """How the (ended or now killed) child ended: ``exit status N`` or ``signal NAME``."""
        try:
            rc = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.kill()
            return "did not exit; killed"
        if rc >= 0:
            return f"exit status {rc}"
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-rc).name}"
        return f"signal {-rc}"

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()


class UserRewardProcess:
    """``reward.fn`` scored in a child process: ``score_many(items, timeout_s, concurrency)``
    never raises and never lets the user's code end this process."""

    def __init__(self, spec: str, timeout_s: float = 10.0) -> None:
        """Start the child; raises ConfigError (naming ``reward.fn``) if the file does not
        load there."""
        self.spec, self.timeout_s = spec, timeout_s
        self.restarts = 0  # children started after the first (one ended or hung)
        self._warned = False  # the first child that ended is logged as a warning
        self._lock = threading.Lock()  # one chunk at a time on the socket
        self._child: _Child | None = None
        self._finalizer: weakref.finalize | None = None  # kills the child with this object
        why = self._start()
        if why is not None:
            raise ConfigError(why if "reward.fn=" in why else f"reward.fn={spec!r}: {why}")

    def _start(self) -> str | None:
        child = _Child(self.spec)
        why = child.ready()
        if why is None:
            self._child, self._finalizer = child, weakref.finalize(self, child.kill)
        return why

    def _forget(self, child: _Child) -> None:
        """``child`` ended or is being killed: the next chunk starts a new one."""
        self._child = None
        if self._finalizer is not None:
            self._finalizer.detach()

    def score_many(
        self, items: list[Item], timeout_s: float, concurrency: int = 8
    ) -> list[RewardOutcome]:
        """One outcome per item, like ``scoring.score_many`` in this process."""
        outcomes: dict[int, RewardOutcome] = {}
        chunks = deque(
            list(range(start, min(start + concurrency, len(items))))
            for start in range(0, len(items), concurrency)
        )
        with self._lock:
            while chunks:
                chunk = chunks.popleft()
                result = self._run([items[i] for i in chunk], timeout_s, concurrency)
                if isinstance(result, _Failed) and result.died and len(chunk) > 1:
                    # which sample ended it: each again on its own
                    chunks.extendleft([i] for i in reversed(chunk))
                    continue
                if isinstance(result, _Failed):
                    result = [RewardOutcome(0.0, False, result.why) for _ in chunk]
                outcomes.update(zip(chunk, result, strict=True))
        return [outcomes[i] for i in range(len(items))]

    def __call__(self, prompt: str, completion: str, metadata: dict) -> dict:
        """One sample (prefer ``score_many``); a failure raises with its reason."""
        [outcome] = self.score_many([(prompt, completion, metadata)], self.timeout_s, 1)
        if outcome.error is not None:
            raise RuntimeError(outcome.error)
        return {"reward": outcome.reward, "correct": outcome.correct}

    def _run(
        self, items: list[Item], timeout_s: float, concurrency: int
    ) -> list[RewardOutcome] | _Failed:
        """The child's outcomes for one chunk, or why there are none."""
        try:
            request = pickle.dumps((items, timeout_s, concurrency))
        except Exception as exc:  # noqa: BLE001 - e.g. metadata that cannot be pickled
            return _Failed(f"the samples cannot be sent to the reward process: {exc!r}", False)
        for attempt in (1, 2):  # a child that died idle (a late abandoned call) is replaced
            if self._child is None:
                self.restarts += 1
                why = self._start()
                if why is not None:
                    return _Failed(f"the reward process did not restart: {why}", False)
            child = self._child
            try:
                child.conn.send_bytes(request)
                break
            except OSError:
                self._ended(child)
                if attempt == 2:
                    return _Failed("the reward process ended before scoring", False)
        if not child.conn.poll(timeout_s + ANSWER_GRACE_S):
            self._forget(child)
            child.kill()  # a call stuck in C code, holding the GIL
            return _Failed(f"timeout after {timeout_s}s (the reward process was killed)", False)
        try:
            answer = child.conn.recv()
        except (EOFError, OSError):
            return _Failed(f"the reward function ended its process ({self._ended(child)})", True)
        return [RewardOutcome(reward, correct, error) for reward, correct, error in answer]

    def _ended(self, child: _Child) -> str:
        """Forget a child that ended; how it ended (logged)."""
        self._forget(child)
        status = child.status()
        with contextlib.suppress(OSError):
            child.conn.close()
        (log.debug if self._warned else log.warning)(
            "reward.fn=%s ended its process (%s): a new one starts and the sample that ended "
            "it scores 0 (later restarts are logged at debug level)",
            self.spec,
            status,
        )
        self._warned = True
        return status

    def close(self) -> None:
        """Stop the child (it also stops by itself when this process ends)."""
        with self._lock:
            if self._child is not None:
                child = self._child
                self._forget(child)
                child.kill()


def _serve(spec: str, fd: int) -> None:
    """The child: import ``spec``, then score each chunk the parent sends until it hangs up."""
    from rlsys.rewards.user import load_user_reward

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the parent; EOF stops this
    conn = Connection(fd)
    try:
        fn = load_user_reward(spec)
    except ConfigError as exc:
        conn.send(str(exc))
        return
    conn.send(None)
    while True:
        try:
            items, timeout_s, concurrency = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the parent ended or closed: so does this process
        outcomes = score_many(fn, items, timeout_s, concurrency)
        conn.send([(o.reward, o.correct, o.error) for o in outcomes])


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # abandoned calls may still run on daemon threads: do not wait for them
