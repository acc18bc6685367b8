"""A run's config as programs take it: read (``rlsys.config``: composed, each section's values
checked), then resolved here: every name it gives looked up in its registry, and the
sections checked against each other with what the named implementations can do.

``rlsys.config`` is plain data and imports no implementation; this package is where the
config meets the registries, so every program (``rlsys train``, ``plan``, ``submit``, the
benchmarks) loads its config through ``load_config`` or ``load_run_config``."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from rlsys.algorithms.traits import uses_critic
from rlsys.config.elastic import RESIZABLE_GROUPS, deepspeed_refusal
from rlsys.config.errors import ConfigError
from rlsys.config.loader import read_config, read_run_config
from rlsys.config.schema import TrainConfig
from rlsys.resolve.across import check_train_config
from rlsys.resolve.names import check_names
from rlsys.resolve.plugins import absolute, load_plugins
from rlsys.resolve.precision import resolve_precision

__all__ = ["load_config", "load_run_config", "resized", "resolve"]


def resolve(cfg: TrainConfig, program: str = "train") -> TrainConfig:
    """``cfg`` with its plugins imported (their paths made absolute), its names and
    cross-section rules checked for ``program`` (``train``, ``sft``, ``eval``, ...: each is
    asked only for the keys it uses), an ``auto`` precision decided for this machine
    (``rlsys.resolve.precision``); raises ConfigError naming the key at fault and the fix."""
    load_plugins(cfg.plugins)
    cfg = dataclasses.replace(cfg, plugins=absolute(cfg.plugins)) if cfg.plugins else cfg
    check_names(cfg)
    cfg, notes = resolve_precision(cfg)
    for note in notes:
        logging.getLogger("rlsys").info("precision: %s", note)
    check_train_config(cfg, program)
    return cfg


def load_config(
    overrides: list[str] | None = None, config_name: str = "config", program: str = "train"
) -> TrainConfig:
    """Compose ``conf/<config_name>.yaml`` with ``overrides`` and check all of it, as
    ``program`` uses it."""
    return resolve(read_config(overrides, config_name), program)


def load_run_config(path: str | Path, plugins: bool = False) -> TrainConfig:
    """The config a run wrote (``<run_dir>/config.yaml``), checked again in full. A config
    naming plugins is refused unless ``plugins`` (the caller knows the run is the user's own,
    e.g. a live run on this machine, which imported them already): reading a run directory
    must not run code."""
    cfg = read_run_config(path)
    if cfg.plugins and not plugins:
        raise ConfigError(
            f"{path} names plugins {cfg.plugins}: they run code, and a saved run config does "
            "not import them by itself; run the command with the plugins given on its own "
            "command line, or remove plugins from that config"
        )
    return resolve(cfg)


def resized(cfg: TrainConfig, sizes: dict[str, int]) -> TrainConfig:
    """``cfg`` with the learner groups at ``sizes`` (``{"learner": 2}``), checked as a new run
    of that size would be; raises ConfigError naming the key and the fix."""
    changes = {}
    for key, size in sizes.items():
        if key not in RESIZABLE_GROUPS:
            raise ConfigError(f"{key}: only {list(RESIZABLE_GROUPS)} are learner groups")
        group = getattr(cfg, key)
        if key == "critic" and not uses_critic(cfg.algorithm):
            raise ConfigError(
                f"critic={size}: algorithm.advantage={cfg.algorithm.advantage} runs no critic; "
                "resize the learner alone"
            )
        if group.backend == "deepspeed" and size != group.world_size:
            raise ConfigError(deepspeed_refusal(key, group.world_size))
        changes[key] = dataclasses.replace(group, world_size=size)
    return resolve(dataclasses.replace(cfg, **changes))
