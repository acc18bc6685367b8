"""LoRA on both backends, on gloo in real processes: only the adapters train, hold optimizer
state and travel; 2 ranks train exactly like 1; the base model (adapters off) is the
unchanged starting model; a checkpoint holds only the adapters and resumes exactly; the
export is a PEFT adapter or a merged model, both equal to the live policy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from backend_harness import NO_DEEPSPEED, build, full_state, run_ranks, toy_batch, train_on

from rlsys.algorithms.objectives import PolicyObjective
from rlsys.algorithms.policy_losses import ClipSettings
from rlsys.config.schema import LoraConfig

OBJECTIVE = PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0))
LORA = LoraConfig(rank=4, alpha=8.0)
TARGETS = len(LORA.target_modules)


def _needs(kind: str) -> None:
    if kind != "fsdp2":
        pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)


def _train(rank, world_size, model_dir, kinds):
    """Per kind: logprobs before, one train_step (2 mini-batches), the weights that travel,
    what the optimizer holds and the base model's logprobs after."""
    batch = toy_batch(model_dir)
    out = {}
    for kind in kinds:
        backend = build(kind, model_dir, lora=LORA, lr=1e-2)
        rows, before = backend.forward_logprobs(batch)
        metrics = backend.train_step(batch, OBJECTIVE, num_mini_batches=2, epochs=1, seed=0)
        _, after = backend.forward_logprobs(batch)
        _, base = backend.forward_base_logprobs(batch)
        if kind == "fsdp2":  # what AdamW steps
            trained = sum(p.numel() for g in backend.optimizer.param_groups for p in g["params"])
        else:  # ZeRO builds its fp32 optimizer partitions from the parameters that need grad
            trained = sum(
                getattr(p, "ds_numel", p.numel())
                for p in backend.module.parameters()
                if p.requires_grad
            )
        out[kind] = {
            "rows": rows,
            "before": before,
            "after": after,
            "base": base,
            "metrics": metrics,
            "state": full_state(backend),
            "trained": trained,
            "total": sum(getattr(p, "ds_numel", p.numel()) for p in backend.module.parameters()),
        }
    return out


def _rows(results, kind, key):
    values = np.zeros((11, results[0][kind][key].shape[1]), np.float32)
    for part in results:
        values[part[kind]["rows"]] = part[kind][key]
    return values


@pytest.mark.parametrize("kinds", [["fsdp2", "zero3"]], ids=["fsdp2+zero3"])
def test_lora_trains_only_adapters_and_two_ranks_match_one(tiny_model_dir, tmp_path, kinds):
    _needs(kinds[-1])
    from rlsys.models.loading import load_model

    one = run_ranks(_train, 1, tmp_path / "ws1", tiny_model_dir, kinds)[0]
    two = run_ranks(_train, 2, tmp_path / "ws2", tiny_model_dir, kinds)
    layers = load_model(tiny_model_dir).config.num_hidden_layers
    for kind in kinds:
        mine = one[kind]
        # Only adapters travel, named as PEFT saves them (less its wrapper prefix).
        names = sorted(mine["state"])
        assert len(names) == 2 * TARGETS * layers
        assert all(n.endswith((".lora_A.weight", ".lora_B.weight")) for n in names), names[:3]
        assert "model.layers.0.self_attn.q_proj.lora_A.weight" in names
        # The optimizer holds exactly the adapters: a small fraction of the model.
        adapters = sum(t.numel() for t in mine["state"].values())
        assert mine["trained"] == adapters
        assert mine["trained"] < 0.05 * mine["total"]
        # Training moved the policy; the base (adapters off) is the starting policy, which the
        # adapters (B = 0 at the start) did not change before training.
        np.testing.assert_allclose(mine["base"], mine["before"], atol=1e-6)
        assert np.abs(mine["after"] - mine["before"]).max() > 1e-3
        assert all(t.abs().sum() > 0 for n, t in mine["state"].items() if "lora_B" in n)
        # 2 ranks = 1 rank: forward, loss, grad norm, every adapter after the step.
        for key in ("before", "after", "base"):
            np.testing.assert_allclose(_rows([one], kind, key), _rows(two, kind, key), atol=1e-5)
        ours, theirs = mine["metrics"], two[0][kind]["metrics"]
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
        assert two[0][kind]["state"].keys() == mine["state"].keys()
        for name, tensor in mine["state"].items():
            torch.testing.assert_close(two[0][kind]["state"][name], tensor, atol=2e-5, rtol=1e-4)
    # The two backends agree with each other too.
    for name, tensor in one[kinds[0]]["state"].items():
        torch.testing.assert_close(one[kinds[1]]["state"][name], tensor, atol=2e-5, rtol=1e-4)


def _save_then_train(rank, world_size, model_dir, kind, ckpt_dir, hf_dir):
    backend = build(kind, model_dir, lora=LORA, warmup_steps=2, min_lr_ratio=0.5)
    backend.set_lr(2e-2, decay_steps=6)
    backend.train_step(toy_batch(model_dir, 0), OBJECTIVE, 2, 1, seed=0)
    backend.save_checkpoint(ckpt_dir)
    backend.save_hf(hf_dir)
    rows, logprobs = backend.forward_logprobs(toy_batch(model_dir, 5))
    return {
        "at_save": full_state(backend),
        "rows": rows,
        "logprobs": logprobs,
        "continued": train_on(backend, model_dir, OBJECTIVE),
    }


def _load_then_train(rank, world_size, model_dir, kind, ckpt_dir):
    backend = build(kind, model_dir, lora=LORA, warmup_steps=2, min_lr_ratio=0.5)
    backend.load_checkpoint(ckpt_dir)
    return {"loaded": full_state(backend), "continued": train_on(backend, model_dir, OBJECTIVE)}


@pytest.mark.parametrize("kind", ["fsdp2", "zero2"])
def test_lora_checkpoint_holds_adapters_resumes_exactly_and_exports(tiny_model_dir, tmp_path, kind):
    """Save after a step, train 2 more; fresh processes load and train the same batches:
    identical metrics and adapters. The checkpoint's tensors are the adapters alone. The
    export as a PEFT adapter and as a merged model both give the live policy's logprobs."""
    _needs(kind)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlsys.backends.export import export_hf
    from rlsys.models.logprobs import token_logprobs

    ckpt, hf = tmp_path / "ckpt", tmp_path / "hf"
    first = run_ranks(_save_then_train, 2, tmp_path / "a", tiny_model_dir, kind, str(ckpt), str(hf))
    second = run_ranks(_load_then_train, 2, tmp_path / "b", tiny_model_dir, kind, str(ckpt))
    for name, tensor in first[0]["at_save"].items():
        assert torch.equal(second[0]["loaded"][name], tensor), name
    assert first[0]["continued"]["metrics"] == second[0]["continued"]["metrics"]
    for name, tensor in first[0]["continued"]["state"].items():
        assert torch.equal(second[0]["continued"]["state"][name], tensor), name
    info = json.loads((ckpt / "backend.json").read_text())
    assert info["lora"]["rank"] == LORA.rank and info["lora"]["alpha"] == LORA.alpha

    # The checkpoint stores adapters only (the base is model_path's, never changed).
    from rlsys.backends.export import CHECKPOINT_READERS

    stored = CHECKPOINT_READERS.get(info["backend"])(ckpt)
    assert stored and all(".lora_" in name for name in stored), sorted(stored)[:3]

    batch = toy_batch(tiny_model_dir, 5)
    ids, mask = torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
    live = np.zeros(batch.loss_mask.shape, np.float32)
    for part in first:
        live[part["rows"]] = part["logprobs"]

    def logprobs(model):
        with torch.no_grad():
            return token_logprobs(model.eval(), ids, mask, 1.0)[0].numpy()

    export_hf(str(ckpt), str(tmp_path / "adapter"))
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapted = PeftModel.from_pretrained(base, str(tmp_path / "adapter"))
    np.testing.assert_allclose(
        logprobs(adapted) * batch.loss_mask, live * batch.loss_mask, atol=1e-5
    )

    export_hf(str(ckpt), str(tmp_path / "merged"), merge=True)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    np.testing.assert_allclose(
        logprobs(merged) * batch.loss_mask, live * batch.loss_mask, atol=1e-5
    )
    saved_live = AutoModelForCausalLM.from_pretrained(hf)  # save_hf merges the same way
    for name, tensor in saved_live.state_dict().items():
        torch.testing.assert_close(merged.state_dict()[name], tensor, atol=1e-6, rtol=0)
