"""Plugins: Python files (or importable modules) a run imports in every one of its processes,
the driver and each Ray worker, before its config is resolved, so what they register (a
policy loss, an advantage estimator, a reward, a task, ...) is known by name everywhere.

``plugins=[./my_loss.py]`` is how an implementation that lives outside rlsys joins a run by
config alone (docs/extending.md). A plugin is code the user chose to run, like a reward file:
only the command line's own config imports plugins, never a saved run config by itself (a
downloaded run directory must not run code when read)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path

from rlsys.config.errors import ConfigError

ENV = "RLSYS_PLUGINS"  # the run's plugins, as JSON, for its Ray workers' setup hook
SETUP_HOOK = "rlsys.resolve.plugins.load_from_env"  # runtime_env worker_process_setup_hook
_loaded: dict[str, str] = {}  # plugin as given (absolute for files) -> its module name


def is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec


def absolute(specs: list[str]) -> list[str]:
    """Files as absolute paths (workers may start elsewhere), modules as given."""
    return [str(Path(s).resolve()) if is_file(s) else s for s in specs]


def load_plugins(specs: list[str]) -> None:
    """Import each plugin once per process; raises ConfigError naming the one that failed."""
    for index, spec in enumerate(absolute(specs)):
        if spec in _loaded:
            continue
        key = f"plugins[{index}]={spec}"
        try:
            _loaded[spec] = _import_file(spec) if is_file(spec) else _import_module(spec)
        except ConfigError:
            raise
        except Exception as exc:  # the plugin's own code failed: say where
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            raise ConfigError(
                f"{key} failed on import: {type(exc).__name__}: {exc} (at {frame.filename}:"
                f"{frame.lineno}); fix the plugin or remove it from plugins"
            ) from exc


def load_from_env() -> None:
    """Ray workers' setup hook: import the plugins the driver put in $RLSYS_PLUGINS."""
    load_plugins(json.loads(os.environ.get(ENV, "[]")))


def _import_file(path: str) -> str:
    if not Path(path).is_file():
        raise ConfigError(f"plugins: {path} is not a file; give the path of a .py file")
    # one name per path, the same in every process (objects of the plugin pickle by it)
    digest = hashlib.sha1(path.encode()).hexdigest()[:8]
    name = f"rlsys_plugin_{Path(path).stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"plugins: {path} cannot be imported as Python; give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return name


def _import_module(name: str) -> str:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name.split(".")[0] and exc.name != name:
            raise
        raise ConfigError(
            f"plugins: no module named {name!r} here; give an importable module or a .py file"
        ) from exc
    return name
