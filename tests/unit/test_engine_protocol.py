"""Every rollout engine offers the ``RolloutEngine`` interface the rollout worker drives, with
the same call signatures (checked on the classes: building a vLLM engine is an e2e test's job);
the HF engine's sleep and wake, driven through that interface, on CPU and on a GPU."""

from __future__ import annotations

import inspect

import pytest

from rlsys.engines.base import RolloutEngine
from rlsys.engines.hf import HFEngine
from rlsys.engines.vllm import VLLMEngine

METHODS = ("generate", "update_weights", "view_dtype", "sleep", "wake", "abort")


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


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_hf_engine_wakes_to_the_same_greedy_output(tiny_model_dir, device):
    """sleep() frees at least the weights' accelerator memory (nothing on CPU), and wake()
    restores the same policy: greedy output is unchanged."""
    import torch

    from rlsys.config.schema import RolloutConfig
    from rlsys.models.loading import load_model, load_tokenizer
    from rlsys.types import SamplingParams

    tok = load_tokenizer(tiny_model_dir)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ["1+2=", "33+44=", "70+8="]]
    greedy = SamplingParams(greedy=True, max_new_tokens=8)
    engine: RolloutEngine = HFEngine(tiny_model_dir, "float32", RolloutConfig(), device)
    before = [g[0].token_ids for g in engine.generate(prompts, greedy)]
    if device == "cuda":
        weights = sum(t.numel() * t.element_size() for t in load_model(tiny_model_dir).parameters())
        torch.cuda.synchronize()
        awake = torch.cuda.memory_allocated()
    engine.sleep()
    if device == "cuda":
        freed = awake - torch.cuda.memory_allocated()
        assert freed >= weights, (
            f"sleep() freed {freed} B of GPU memory; the weights hold {weights} B"
        )
    engine.wake()
    assert [g[0].token_ids for g in engine.generate(prompts, greedy)] == before


def test_an_engine_with_settings_is_built_with_them(tiny_model_dir):
    """An engine class registered with a settings dataclass gets them from
    ``rollout.engine_args`` as a fifth argument; one without settings keeps four."""
    from dataclasses import dataclass

    from rlsys.config.errors import ConfigError
    from rlsys.config.schema import RolloutConfig
    from rlsys.engines import ENGINES, build_engine, engine_settings

    @dataclass(frozen=True)
    class TagSettings:
        tag: str = "plain"

    class TaggedEngine(HFEngine):
        def __init__(self, model_path, dtype, cfg, device, settings: TagSettings):
            super().__init__(model_path, dtype, cfg, device)
            self.tag = settings.tag

    ENGINES.register("hf_tagged", settings=TagSettings)(TaggedEngine)
    try:
        cfg = RolloutConfig(engine="hf_tagged", engine_args={"tag": "mine"})
        assert engine_settings(cfg) == TagSettings("mine")
        engine = build_engine(tiny_model_dir, "float32", cfg)
        assert isinstance(engine, TaggedEngine) and engine.tag == "mine"
        assert type(build_engine(tiny_model_dir, "float32", RolloutConfig())) is HFEngine
        with pytest.raises(ConfigError, match=r"rollout.engine_args.tg is not a setting of"):
            engine_settings(RolloutConfig(engine="hf_tagged", engine_args={"tg": "x"}))
    finally:
        ENGINES.unregister("hf_tagged")


def test_a_subclass_keeps_the_hf_engines_settings_by_extending_them(tiny_model_dir):
    """A plugin's settings dataclass that extends ``HFSettings`` carries the HF engine's own
    knobs: passed on to ``HFEngine.__init__``, ``decode_attention=sdpa`` keeps SDPA where the
    default (``auto`` on a CPU) would switch decode steps to matmuls."""
    from dataclasses import dataclass

    from rlsys.config.schema import RolloutConfig
    from rlsys.engines import ENGINES, build_engine
    from rlsys.engines.settings import HFSettings
    from rlsys.models.attention import DECODE_MATMUL

    @dataclass(frozen=True)
    class TagSettings(HFSettings):
        tag: str = "plain"

    class TaggedEngine(HFEngine):
        def __init__(self, model_path, dtype, cfg, device, settings: TagSettings):
            super().__init__(model_path, dtype, cfg, device, settings)
            self.tag = settings.tag

    ENGINES.register("hf_tagged_sdpa", settings=TagSettings)(TaggedEngine)
    try:
        attention = {}
        for choice in ("sdpa", "auto"):
            args = {"tag": "mine", "decode_attention": choice}
            cfg = RolloutConfig(engine="hf_tagged_sdpa", engine_args=args)
            engine = build_engine(tiny_model_dir, "float32", cfg)
            assert engine.tag == "mine"
            attention[choice] = engine.model.config._attn_implementation
        assert attention == {"sdpa": "sdpa", "auto": DECODE_MATMUL}
    finally:
        ENGINES.unregister("hf_tagged_sdpa")


def test_the_hf_engine_adopts_received_tensors_as_its_weights(tiny_model_dir):
    """``update_weights(adopt=True)`` (a zero-copy transport): each parameter becomes the
    received tensor itself (same memory), tied names included; greedy output follows the
    new weights; a tensor of another dtype is refused, naming the fix."""
    import torch

    from rlsys.config.schema import RolloutConfig
    from rlsys.types import SamplingParams

    engine = HFEngine(tiny_model_dir, "float32", RolloutConfig(), torch.device("cpu"))
    assert engine.view_dtype() == "float32"
    greedy = SamplingParams(greedy=True, max_new_tokens=6)
    before = engine.generate([[5, 6, 7]], greedy)[0][0].token_ids
    state = {k: v.clone() * 1.5 for k, v in engine.model.state_dict().items()}
    copy = HFEngine(tiny_model_dir, "float32", RolloutConfig(), torch.device("cpu"))
    copy.update_weights([state], 1)  # the copying path, for comparison
    assert engine.update_weights([state], 1, adopt=True) == len(state)
    for name, param in engine.model.named_parameters(remove_duplicate=False):
        assert param.data_ptr() == state[name].data_ptr(), name
    after = engine.generate([[5, 6, 7]], greedy)[0][0].token_ids
    assert after == copy.generate([[5, 6, 7]], greedy)[0][0].token_ids
    assert after != before  # the scaled weights change what it says
    name = next(iter(state))
    with pytest.raises(ValueError, match="weight_sync.zero_copy=false"):
        engine.update_weights([{name: state[name].to(torch.bfloat16)}], 2, adopt=True)
