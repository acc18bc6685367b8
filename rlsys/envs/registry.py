"""The environment registry (``task.env.name``) and how a run builds the named factory.

An environment is one module: its factory class registers itself there,
``@ENVS.register("<name>")`` or, with options of its own, ``@ENVS.register("<name>",
settings=MySettings)``. A factory without settings is built as ``Factory(cfg.task.env)``;
one with settings as ``Factory(cfg.task.env, settings)``, the settings filled from
``task.env.args`` (any field by its own name) and checked when the config is loaded
(``rlsys.resolve``). ``rlsys/envs/__init__.py`` imports every module of the package, so a
built-in environment needs no other line; one outside rlsys joins with ``plugins=[file.py]``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlsys.algorithms.settings import NoSettings, build_settings
from rlsys.config.env import EnvConfig
from rlsys.envs.base import EnvironmentFactory
from rlsys.registry import Registry

# a factory class, called as (task.env) or, with registered settings, (task.env, settings)
ENVS: Registry[Callable[..., EnvironmentFactory]] = Registry("environment", "task.env.name")


def env_settings(cfg: EnvConfig) -> Any:
    """The settings of environment ``cfg.name`` from ``task.env.args`` (``NoSettings`` for one
    that registered none); raises ConfigError naming a bad ``task.env.args.<key>``."""
    assert cfg.name is not None
    cls = ENVS.settings(cfg.name) or NoSettings
    return build_settings(cls, cfg, dict(cfg.args), "task.env.args", f"task.env.name={cfg.name}")


def make_factory(cfg: EnvConfig) -> EnvironmentFactory:
    """The factory of environment ``cfg.name``, built with its settings if it registered any."""
    assert cfg.name is not None
    factory = ENVS.get(cfg.name)
    if ENVS.settings(cfg.name) is None:
        return factory(cfg)
    return factory(cfg, env_settings(cfg))
