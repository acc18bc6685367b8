"""The HF engine's compiled decode loop (``rollout.engine_args.compile``: a static KV cache and
a ``torch.compile``d forward step) generates what the eager loop does, follows weight updates
and sleep/wake, and is refused by name for a model transformers cannot compile."""

from __future__ import annotations

import pytest
import torch

from rlsys.config.errors import ConfigError
from rlsys.config.schema import RolloutConfig
from rlsys.engines import engine_settings
from rlsys.engines.hf import HFEngine, _compiled_decode
from rlsys.engines.settings import HFSettings
from rlsys.types import SamplingParams


# the CPU case in the long tier: the compiled loop is off by default and slower than the eager one
# on CPUs (docs/roofline.md), and inductor building its C++ costs 25-33 s of a 2-core CI
@pytest.mark.parametrize(
    "device",
    [pytest.param("cpu", marks=pytest.mark.long), pytest.param("cuda", marks=pytest.mark.gpu)],
)
def test_the_compiled_loop_generates_what_the_eager_loop_does(tiny_model_dir, device):
    """Greedy replies and their log-probabilities agree with the eager engine's over calls
    of two batch sizes (the compiled step is reused or recompiled, never wrong), after a
    weight update that changes the replies (the compiled step reads the new weights), and
    after sleep and wake (the weights come back to new memory)."""
    from rlsys.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    prompts = [tok.encode(t, add_special_tokens=False) for t in ["1+2=", "33+44=", "70+8="]]
    eager = HFEngine(tiny_model_dir, "float32", RolloutConfig(), device)
    compiled = HFEngine(tiny_model_dir, "float32", RolloutConfig(), device, HFSettings(True))

    def agree(batch: list[list[int]], n: int = 1) -> list[list[int]]:
        greedy = SamplingParams(greedy=True, max_new_tokens=10, n=n)
        want = [c for g in eager.generate(batch, greedy) for c in g]
        got = [c for g in compiled.generate(batch, greedy) for c in g]
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        for mine, theirs in zip(got, want, strict=True):
            assert torch.allclose(
                torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=1e-4
            )
        return [c.token_ids for c in want]

    from torch._dynamo.utils import counters

    counters.clear()
    before = agree(prompts)
    assert counters["stats"]["unique_graphs"] >= 1, "generate ran no compiled graph"
    agree(prompts[:2], n=3)
    generator = torch.Generator().manual_seed(0)
    update = {
        name: tensor + 0.5 * torch.randn(tensor.shape, generator=generator).to(tensor)
        for name, tensor in eager.model.state_dict().items()
        if tensor.is_floating_point()
    }
    for engine in (eager, compiled):
        engine.update_weights([{k: v.clone() for k, v in update.items()}], version=1)
    assert agree(prompts) != before, "the update should change the greedy replies"
    compiled.sleep()
    compiled.wake()
    agree(prompts)


def test_a_model_without_static_cache_support_is_refused_by_name():
    with pytest.raises(ValueError, match=r"rollout.engine_args.compile=false"):
        _compiled_decode(torch.nn.Linear(2, 2), torch.device("cpu"), HFSettings(compile=True))
    assert _compiled_decode(torch.nn.Linear(2, 2), torch.device("cpu"), HFSettings()) == {}


def test_the_hf_engine_settings_come_from_engine_args():
    assert engine_settings(RolloutConfig(engine_args={"compile": True})) == HFSettings(True)
    with pytest.raises(ConfigError, match=r"rollout.engine_args: compile_mode='fast' must be"):
        engine_settings(RolloutConfig(engine_args={"compile_mode": "fast"}))
    with pytest.raises(ConfigError, match=r"compile='false' must be true or false"):
        engine_settings(RolloutConfig(engine_args={"compile": "false"}))
    with pytest.raises(ConfigError, match=r"rollout.engine_args.compiled is not a setting"):
        engine_settings(RolloutConfig(engine_args={"compiled": True}))
