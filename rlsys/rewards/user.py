"""User reward functions loaded from a Python file: ``reward.fn=path/to/file.py:function``."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

from rlsys.config.errors import ConfigError
from rlsys.rewards.registry import RewardFn


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
