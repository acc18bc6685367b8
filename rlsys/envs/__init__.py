"""Multi-turn environments (``task.env.name``): the interface, the tool-call formats (the
environments' compact one and the chat formats the rollout translates, ``task.env.tool_format``),
the rollout that alternates model turns with observations, and the built-in environments.

Every module of this package is imported here, so a built-in environment is one module whose
factory registers itself (``@ENVS.register(...)``, ``rlsys/envs/registry.py``)."""

import importlib
import pkgutil

from rlsys.envs.base import Environment, EnvironmentFactory, StepResult
from rlsys.envs.registry import ENVS, env_settings, make_factory
from rlsys.envs.rollout import EpisodeRunner

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # each registers what it defines

__all__ = [
    "ENVS",
    "Environment",
    "EnvironmentFactory",
    "EpisodeRunner",
    "StepResult",
    "env_settings",
    "make_factory",
]
