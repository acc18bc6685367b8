"""Typed configs (the defaults) and their Hydra composition."""

from rlsys.config.errors import ConfigError
from rlsys.config.schema import TrainConfig

__all__ = ["ConfigError", "TrainConfig"]
