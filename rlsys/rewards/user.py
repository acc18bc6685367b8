"""User reward functions loaded from a Python file: ``reward.fn=path/to/file.py:function``.

The scorer runs them in a child process of its own (``rlsys.rewards.user_process``), which
loads them with ``load_user_reward`` and calls them on its threads (``rlsys.rewards.scoring``):
an exception, ``sys.exit`` or a timeout scores the sample 0 and counts an error, and so does
``os._exit``: once a user reward is loaded, ``os._exit`` called on a reward thread raises
``RewardExit`` there instead of ending the process (the child is not restarted for it). What
cannot be caught in-process (``posix._exit``, a segfault in C code) ends only the child,
after ``faulthandler`` prints every thread's traceback; the parent scores that sample 0.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import inspect
import os
import sys
import threading
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.rewards.registry import RewardFn
from rlsys.rewards.scoring import in_reward_call

_guard_lock = threading.Lock()
_real_exit = os._exit


class RewardExit(RuntimeError):
    """A reward function called ``os._exit``: it scores 0 instead of ending the process."""


def _guarded_exit(status: int) -> None:
    if in_reward_call():
        raise RewardExit(
            f"the reward function called os._exit({status}); that would end the trainer, so "
            "the sample scores 0"
        )
    _real_exit(status)


def _guard_process() -> None:
    """Make ``os._exit`` on a reward thread an exception, and have a fatal signal print every
    thread's stack (idempotent)."""
    with _guard_lock:
        if os._exit is not _guarded_exit:
            os._exit = _guarded_exit
        if not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)


def load_user_reward(spec: str) -> RewardFn:
    """The function ``name`` of the file in ``spec`` ("path.py:name"), sync or async, taking
    ``(prompt, completion, metadata)``. The file is imported once under a private module
    name, so it may import its own helpers from beside it."""
    path_text, _, name = spec.rpartition(":")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(
            f"reward.fn={spec!r}: {path} is not a file; pass reward.fn=path/to/file.py:function "
            "(relative paths are from the directory rlsys runs in)"
        )
    _guard_process()
    module_name = f"rlsys_user_reward_{abs(hash(str(path)))}"
    module = sys.modules.get(module_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.path.insert(0, str(path.parent))
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            raise ConfigError(f"reward.fn={spec!r}: importing {path} failed: {exc!r}") from exc
        finally:
            sys.path.remove(str(path.parent))
        sys.modules[module_name] = module
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if inspect.isfunction(v))
        raise ConfigError(
            f"reward.fn={spec!r}: {path} has no function {name!r}; its functions: {found}"
        )
    try:
        inspect.signature(fn).bind("prompt", "completion", {})
    except TypeError as exc:
        raise ConfigError(
            f"reward.fn={spec!r}: {name} must accept (prompt, completion, metadata): {exc}"
        ) from exc
    return fn
