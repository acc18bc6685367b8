"""Every rollout engine offers the ``RolloutEngine`` interface the rollout worker drives, with
the same call signatures (checked on the classes: building a vLLM engine is an e2e test's job)."""

from __future__ import annotations

import inspect

import pytest

from rlsys.engines.base import RolloutEngine
from rlsys.engines.hf import HFEngine
from rlsys.engines.vllm import VLLMEngine

METHODS = ("generate", "update_weights", "sleep", "wake", "abort")


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("engine", [HFEngine, VLLMEngine])
def test_engines_have_the_protocol_calls(engine):
    for name in METHODS:
        assert _parameters(getattr(engine, name)) == _parameters(getattr(RolloutEngine, name)), name


def test_the_hf_engine_is_a_rollout_engine(tiny_model_dir):
    import torch

    from rlsys.config.schema import RolloutConfig

    engine = HFEngine(tiny_model_dir, "float32", RolloutConfig(), torch.device("cpu"))
    assert isinstance(engine, RolloutEngine)
    assert engine.version == 0
