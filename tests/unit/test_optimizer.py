"""The backends' AdamW: fused, and still fused after loading an older optimizer state."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from rlsys.backends.base import TrainingBackend
from rlsys.config.learner import OptimConfig


def test_adamw_is_fused_and_stays_fused_after_loading_a_loop_state():
    params = [torch.nn.Parameter(torch.ones(4))]
    loop = torch.optim.AdamW(params, lr=1e-3)  # torch's CPU default: fused=None, a loop
    params[0].grad = torch.ones(4)
    loop.step()
    saved = loop.state_dict()
    assert saved["param_groups"][0]["fused"] is None

    backend = SimpleNamespace(optim_cfg=OptimConfig(lr=1e-3))
    backend._adam_settings = lambda: TrainingBackend._adam_settings(backend)
    fused = TrainingBackend._adamw(backend, params)
    assert fused.param_groups[0]["fused"] is True
    fused.load_state_dict(saved)
    assert fused.param_groups[0]["fused"] is True
    assert fused.state[params[0]]["step"] == saved["state"][0]["step"]  # the state came over
    before = params[0].detach().clone()
    fused.step()  # the fused kernel accepts the loaded state
    assert not torch.equal(params[0], before)
