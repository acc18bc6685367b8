"""Rollout engines (learner code never imports these).

Every engine is built as ``ENGINES.get(name)(model_path, dtype, rollout_cfg, device)`` and is a
``RolloutEngine`` (``rlsys/engines/base.py``): ``generate``, ``update_weights``, ``sleep``,
``wake``, ``abort`` and a ``version`` attribute.
"""

from collections.abc import Callable

from rlsys.engines.base import RolloutEngine
from rlsys.registry import Registry

# a builder (model_path, dtype, rollout_cfg, device) -> engine, importing its module when called
ENGINES: Registry[Callable[..., RolloutEngine]] = Registry("rollout engine", "rollout.engine")


@ENGINES.register("hf")
def _hf(*args, **kwargs):
    from rlsys.engines.hf import HFEngine

    return HFEngine(*args, **kwargs)


@ENGINES.register("vllm", tensor_parallel=True)  # one engine over several GPUs
def _vllm(*args, **kwargs):
    from rlsys.engines.vllm import VLLMEngine

    return VLLMEngine(*args, **kwargs)
