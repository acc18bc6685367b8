"""Rollout engines (learner code never imports these)."""

from rlsys.registry import Registry

ENGINES: Registry = Registry("rollout engine", "rollout.engine")


@ENGINES.register("hf")
def _hf(*args, **kwargs):
    from rlsys.engines.hf import HFEngine

    return HFEngine(*args, **kwargs)
