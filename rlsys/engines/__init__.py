"""Rollout engines (learner code never imports these).

Every engine is built by ``build_engine(model_path, dtype, rollout_cfg, device)`` and is a
``RolloutEngine`` (``rlsys/engines/base.py``): ``generate``, ``update_weights``, ``sleep``,
``wake``, ``abort`` and a ``version`` attribute.

An engine joins ``ENGINES`` with one decorator line: on its class, in a plugin file that may
import what it needs (``@ENGINES.register("<name>")``), or on a small builder that imports
its module when called, as the built-ins below do, so ``rollout.engine`` resolves without
torch or vLLM. One with options of its own registers a settings dataclass
(``settings=MySettings``) and is built with it as a fifth argument, filled from
``rollout.engine_args`` and checked when the config is loaded (``rlsys.resolve``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlsys.algorithms.settings import NoSettings, build_settings
from rlsys.engines.base import RolloutEngine
from rlsys.engines.settings import HFSettings
from rlsys.registry import Registry

if TYPE_CHECKING:
    from rlsys.config.rollout import RolloutConfig

# a builder (model_path, dtype, rollout_cfg, device[, settings]) -> engine: an engine class,
# or a function importing the engine's module when called
ENGINES: Registry[Callable[..., RolloutEngine]] = Registry("rollout engine", "rollout.engine")


def engine_settings(cfg: RolloutConfig) -> Any:
    """The settings of engine ``cfg.engine`` from ``rollout.engine_args`` (``NoSettings`` for
    one that registered none); raises ConfigError naming a bad ``rollout.engine_args.<key>``."""
    cls = ENGINES.settings(cfg.engine) or NoSettings
    return build_settings(
        cls, cfg, dict(cfg.engine_args), "rollout.engine_args", f"rollout.engine={cfg.engine}"
    )


def build_engine(
    model_path: str, dtype: str, cfg: RolloutConfig, device: str = "cpu"
) -> RolloutEngine:
    """The engine ``cfg.engine`` names, with its settings if it registered any."""
    builder = ENGINES.get(cfg.engine)
    if ENGINES.settings(cfg.engine) is None:
        return builder(model_path, dtype, cfg, device)
    return builder(model_path, dtype, cfg, device, engine_settings(cfg))


@ENGINES.register("hf", settings=HFSettings)
def _hf(*args, **kwargs):
    from rlsys.engines.hf import HFEngine

    return HFEngine(*args, **kwargs)


@ENGINES.register("vllm", tensor_parallel=True)  # one engine over several GPUs
def _vllm(*args, **kwargs):
    from rlsys.engines.vllm import VLLMEngine

    return VLLMEngine(*args, **kwargs)
