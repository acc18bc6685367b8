"""Multi-turn environments (``task.env.name``): the interface, the tool-call formats (the
environments' compact one and the chat formats the rollout translates, ``task.env.tool_format``),
the rollout that alternates model turns with observations, and the built-in environments."""

from rlsys.envs.base import Environment, EnvironmentFactory, StepResult
from rlsys.envs.calculator import Calculator
from rlsys.envs.guess_number import GuessNumber
from rlsys.envs.latency import Latency
from rlsys.envs.lookup import SearchEnvironment, SQLEnvironment
from rlsys.envs.rollout import EpisodeRunner
from rlsys.registry import Registry

# an environment factory class: ENVS.get(name)(cfg.task.env) makes the factory
# (rlsys/envs/base.py)
ENVS: Registry[type[EnvironmentFactory]] = Registry("environment", "task.env.name")
ENVS.register("calculator")(Calculator)
ENVS.register("guess_number")(GuessNumber)
ENVS.register("latency")(Latency)
ENVS.register("sql")(SQLEnvironment)
ENVS.register("search")(SearchEnvironment)

__all__ = ["ENVS", "Environment", "EnvironmentFactory", "EpisodeRunner", "StepResult"]
