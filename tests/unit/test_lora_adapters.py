"""LoRA pieces in one process: PEFT's adapters, the wire names, the merge an engine does, the
base model with adapters off, and the config's checks."""

from __future__ import annotations

import pytest
import torch

from rlsys.config.errors import ConfigError
from rlsys.config.schema import LoraConfig
from rlsys.models import lora
from rlsys.models.loading import load_model
from rlsys.resolve import load_config

CFG = LoraConfig(rank=4, alpha=8.0)


def _adapted(model_dir: str):
    """The tiny model with adapters whose B is random (so they change the output)."""
    model = lora.add_adapters(load_model(model_dir), CFG)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    return model


def _wire_state(model) -> dict[str, torch.Tensor]:
    return {
        lora.wire_name(n): p.detach().clone()
        for n, p in model.named_parameters()
        if p.requires_grad
    }


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[3, 5, 7, 9, 11, 4, 8]])


def test_only_adapters_train_and_travel_by_peft_names(tiny_model_dir):
    model = _adapted(tiny_model_dir)
    state = _wire_state(model)
    layers = model.config.num_hidden_layers
    assert len(state) == 2 * len(CFG.target_modules) * layers
    assert "model.layers.1.mlp.down_proj.lora_B.weight" in state
    a = state["model.layers.0.self_attn.q_proj.lora_A.weight"]
    assert a.shape == (CFG.rank, model.config.hidden_size)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert "model.layers.0.self_attn.q_proj.base_layer.weight" in frozen
    assert "model.embed_tokens.weight" in frozen


def test_merged_weights_give_the_adapted_models_output(tiny_model_dir):
    """What an engine loads (the base + scale * B @ A) computes what PEFT's model does, and
    the base model with adapters off is the plain model."""
    from rlsys.backends.lora_merge import merged_state

    adapted = _adapted(tiny_model_dir)
    plain = load_model(tiny_model_dir)
    expected, base_logits = _logits(adapted, IDS), _logits(plain, IDS)
    assert (expected - base_logits).abs().max() > 1e-3  # the adapters matter
    with lora.adapters_off(adapted):
        torch.testing.assert_close(_logits(adapted, IDS), base_logits)
    torch.testing.assert_close(_logits(adapted, IDS), expected)  # back on after the block
    plain.load_state_dict(merged_state(plain, _wire_state(adapted), CFG.scale), strict=False)
    torch.testing.assert_close(_logits(plain, IDS), expected, atol=1e-5, rtol=1e-5)


def test_engine_merger_pairs_matrices_across_buckets_and_keeps_the_base(tiny_model_dir):
    """An A and its B in different buckets still merge; each sync merges into the pristine
    base (not the previous merge); the result is in the engine's dtype."""
    adapted = _adapted(tiny_model_dir)
    state = _wire_state(adapted)
    names = sorted(state)
    a_names = [n for n in names if "lora_A" in n]
    b_names = [n for n in names if "lora_B" in n]
    merger = lora.AdapterMerger(tiny_model_dir, "bfloat16", CFG.scale)
    base = load_model(tiny_model_dir).state_dict()
    for _ in range(2):  # a second sync of the same adapters gives the same weights
        buckets = [{n: state[n] for n in a_names}, {n: state[n] for n in b_names}]
        merged = {k: v for bucket in merger(iter(buckets)) for k, v in bucket.items()}
        assert len(merged) == len(a_names)
        name = "model.layers.0.self_attn.q_proj"
        want = base[f"{name}.weight"].bfloat16().float() + CFG.scale * (
            state[f"{name}.lora_B.weight"] @ state[f"{name}.lora_A.weight"]
        )
        assert merged[f"{name}.weight"].dtype == torch.bfloat16
        torch.testing.assert_close(merged[f"{name}.weight"].float(), want, atol=1e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="without their pair"):
        list(merger(iter([{a_names[0]: state[a_names[0]]}])))


def test_merger_reads_only_safetensors_and_names_the_fix(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")
    merger = lora.AdapterMerger(str(tmp_path), "float32", 2.0)
    bucket = {"m.lora_A.weight": torch.ones(2, 3), "m.lora_B.weight": torch.ones(3, 2)}
    with pytest.raises(FileNotFoundError, match="safetensors"):
        list(merger(iter([bucket])))


def test_targets_that_match_nothing_name_the_key(tiny_model_dir):
    with pytest.raises(ValueError, match="model.lora.target_modules"):
        lora.add_adapters(load_model(tiny_model_dir), LoraConfig(rank=4, target_modules=["nope"]))


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.lora.rank=-1", "model.lora.rank"),
        ("model.lora.dropout=1.0", "model.lora.dropout"),
        ("model.lora.alpha=0", "model.lora.alpha"),
        ("model.lora.target_modules=[]", "model.lora.target_modules"),
    ],
)
def test_bad_lora_keys_are_refused_by_name(override, key):
    overrides = [override] if "rank" in override else ["model.lora.rank=8", override]
    with pytest.raises(ConfigError, match=key):
        load_config(overrides)


def test_a_lora_kl_run_starts_no_reference_group_unless_asked():
    from rlsys.placement.resources import Roles

    lora_kl = ["model.lora.rank=8", "algorithm.kl_coef=0.05"]
    assert not Roles.for_rl(load_config(lora_kl)).reference
    assert load_config(lora_kl).reference_from_learner
    assert Roles.for_rl(load_config([*lora_kl, "reference.from_lora_base=false"])).reference
    assert Roles.for_rl(load_config(["algorithm.kl_coef=0.05"])).reference
    assert not Roles.for_rl(load_config(["model.lora.rank=8"])).reference
