"""What a learner trades for memory, on gloo in real processes: activation checkpointing trains
exactly like keeping activations (FSDP2 at 1 and 2 ranks, with LoRA, DeepSpeed ZeRO-2/3),
FSDP2's MixedPrecisionPolicy (bf16 parameters in forward/backward, fp32 master weights) stays
within bf16 rounding of the fp32 learner, and the LM head in slices with micro-batches cut by
a token budget train like whole logits in one micro-batch (FSDP2 and ZeRO-3 on 2 ranks)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from backend_harness import NO_DEEPSPEED, full_state, learner_config, run_ranks, toy_batch

from rlsys.algorithms.objectives import PolicyObjective
from rlsys.algorithms.policy_losses import ClipSettings
from rlsys.config.schema import LoraConfig

OBJECTIVE = PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0))
LORA = LoraConfig(rank=4, alpha=8.0)
# Recomputing a layer runs the same ops on the same inputs: fp32 results agree to rounding.
CKPT_RTOL = 1e-5
# bf16 keeps 8 bits of mantissa: the tiny model's log-probabilities move by ~0.01 nats
BF16_LOGPROB_MEAN, BF16_LOGPROB_MAX, BF16_LOSS_ABS = 0.02, 0.5, 0.02


@dataclasses.dataclass(frozen=True)
class Case:
    """One learner to build: the backend kind (backend_harness.learner_config) and its keys."""

    kind: str = "fsdp2"
    activation_checkpointing: bool = False
    mixed_precision: str | None = None
    lora: bool = False
    # learner.logits_chunk_tokens / max_tokens_per_micro_batch; None: the head at once, rows
    logits_chunk_tokens: int | None = None
    max_tokens_per_micro_batch: int | None = None


CASES = {
    "plain": Case(),
    "ckpt": Case(activation_checkpointing=True),
    "lora": Case(lora=True),
    "lora_ckpt": Case(activation_checkpointing=True, lora=True),
    "bf16": Case(mixed_precision="bfloat16"),  # 1 rank: autocast; 2 ranks: MixedPrecisionPolicy
    "zero2_ckpt": Case("zero2", activation_checkpointing=True),
    "zero3_ckpt": Case("zero3", activation_checkpointing=True),
    # slices of 3 positions; micro-batches of 1 row of the toy batch's 10 tokens, not 2
    "sliced": Case(logits_chunk_tokens=3, max_tokens_per_micro_batch=19),
    "zero3_sliced": Case("zero3", logits_chunk_tokens=3, max_tokens_per_micro_batch=19),
}
ONE_RANK = ["plain", "ckpt", "lora", "lora_ckpt", "bf16"]
TWO_RANKS = ["plain", "ckpt", "bf16", "sliced"]
DEEPSPEED = ["zero2_ckpt", "zero3_ckpt", "zero3_sliced"]


def _build(case: Case, model_dir: str):
    from rlsys.backends import build_backend

    cfg = dataclasses.replace(
        learner_config(case.kind),
        activation_checkpointing=case.activation_checkpointing,
        mixed_precision=case.mixed_precision,
        logits_chunk_tokens=case.logits_chunk_tokens,
        max_tokens_per_micro_batch=case.max_tokens_per_micro_batch,
    )
    lora = LORA if case.lora else None
    return build_backend(cfg, model_dir, "float32", 1.0, torch.device("cpu"), lora=lora)


def _train(rank, world_size, model_dir, names):
    """Per case: forward log-probabilities, one train_step (2 mini-batches), the weights after,
    how often layer 0's MLP ran in the step and the dtype of its weights while it ran."""
    from rlsys.models.blocks import decoder_layers

    batch = toy_batch(model_dir)
    out = {}
    for name in names:
        backend = _build(CASES[name], model_dir)
        rows, logprobs = backend.forward_logprobs(batch)
        mlp = decoder_layers(backend.module)[0].mlp
        seen: list[torch.dtype] = []
        # a pre-hook: a recomputation stops once it has what backward needs, which is before
        # the MLP returns (its down projection's input), so a post-hook would miss it
        hook = mlp.register_forward_pre_hook(
            lambda m, i, seen=seen: seen.append(m.up_proj.weight.dtype)
        )
        metrics = backend.train_step(batch, OBJECTIVE, num_mini_batches=2, epochs=1, seed=0)
        hook.remove()
        masters = [
            p.to_local() if hasattr(p, "to_local") else p for p in backend.module.parameters()
        ]
        out[name] = {
            "rows": rows,
            "logprobs": logprobs,
            "metrics": metrics,
            "state": full_state(backend),
            "mlp_calls": len(seen),
            "compute_dtypes": set(seen),
            "master_dtypes": {p.dtype for p in masters},
            "optim_dtypes": _optimizer_dtypes(backend),
        }
    return out


def _optimizer_dtypes(backend) -> set[torch.dtype]:
    """What FSDP2's AdamW state is held in (DeepSpeed keeps its own: not inspected here)."""
    if backend.name != "fsdp2":
        return set()
    return {v.dtype for state in backend.optimizer.state.values() for v in state.values()}


def _logprobs(results: list[dict], name: str) -> np.ndarray:
    logprobs = np.zeros((11, results[0][name]["logprobs"].shape[1]), np.float32)
    for part in results:
        logprobs[part[name]["rows"]] = part[name]["logprobs"]
    return logprobs


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory) -> dict[int, list[dict]]:
    tmp = tmp_path_factory.mktemp("memory")
    return {
        1: run_ranks(_train, 1, tmp / "ws1", tiny_model_dir, ONE_RANK),
        2: run_ranks(_train, 2, tmp / "ws2", tiny_model_dir, TWO_RANKS),
    }


def _assert_same_step(a: dict, b: dict, what: str, rtol: float, atol: float) -> None:
    for key in ("loss", "grad_norm", "trained_tokens", "clip_frac"):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], rel=rtol, abs=1e-7), what
    assert a["state"].keys() == b["state"].keys()
    for name, tensor in a["state"].items():
        torch.testing.assert_close(b["state"][name], tensor, rtol=rtol, atol=atol, msg=what)


@pytest.mark.parametrize(
    ("ranks", "plain", "ckpt"),
    [(1, "plain", "ckpt"), (1, "lora", "lora_ckpt"), (2, "plain", "ckpt")],
)
def test_activation_checkpointing_trains_like_keeping_activations(trained, ranks, plain, ckpt):
    """learner.activation_checkpointing=true recomputes each layer in backward (its MLP runs
    once more per micro-batch) and gives the same loss, grad norm and weights, within
    CKPT_RTOL (fp32): alone, under FSDP2 on 2 ranks and with LoRA adapters."""
    a, b = trained[ranks][0][plain], trained[ranks][0][ckpt]
    assert b["mlp_calls"] == 2 * a["mlp_calls"] > 0
    np.testing.assert_allclose(
        _logprobs(trained[ranks], ckpt), _logprobs(trained[ranks], plain), rtol=CKPT_RTOL
    )
    _assert_same_step(a, b, f"{ranks} rank(s): {plain} vs {ckpt}", CKPT_RTOL, 1e-7)


def test_mixed_precision_policy_computes_in_bf16_with_fp32_master_weights(trained):
    """learner.mixed_precision=bfloat16 on 2 FSDP2 ranks: layers see bf16 weights (FSDP2's
    MixedPrecisionPolicy all-gathers them in bf16), while the sharded master weights and
    AdamW state stay fp32; log-probabilities, loss and grad norm stay within bf16 rounding of
    one fp32 process (BF16_* tolerances) and of one process under autocast."""
    mp, fp32, autocast = trained[2][0]["bf16"], trained[1][0]["plain"], trained[1][0]["bf16"]
    assert mp["compute_dtypes"] == {torch.bfloat16}
    assert autocast["compute_dtypes"] == {torch.float32}  # autocast casts per op, not weights
    assert mp["master_dtypes"] == {torch.float32} and mp["optim_dtypes"] == {torch.float32}
    assert {t.dtype for t in mp["state"].values()} == {torch.float32}
    gap = np.abs(_logprobs(trained[2], "bf16") - _logprobs(trained[1], "plain"))
    assert 0 < gap.mean() < BF16_LOGPROB_MEAN and gap.max() < BF16_LOGPROB_MAX
    assert mp["metrics"]["loss"] == pytest.approx(fp32["metrics"]["loss"], abs=BF16_LOSS_ABS)
    assert mp["metrics"]["grad_norm"] == pytest.approx(fp32["metrics"]["grad_norm"], rel=0.05)
    to_autocast = np.abs(_logprobs(trained[2], "bf16") - _logprobs(trained[1], "bf16"))
    assert to_autocast.mean() < BF16_LOGPROB_MEAN


def test_deepspeed_activation_checkpointing_trains_like_fsdp2(tiny_model_dir, tmp_path, trained):
    """The same key on DeepSpeed (model-level, so ZeRO-3's parameter gathering runs again in
    the recomputation): ZeRO-2 and ZeRO-3 on 2 ranks match one FSDP2 process keeping its
    activations, within the sharded-reduction tolerance of test_deepspeed_gloo.py."""
    pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    two = run_ranks(_train, 2, tmp_path, tiny_model_dir, DEEPSPEED)
    plain, fsdp2_rank = trained[1][0]["plain"], trained[2][0]["plain"]
    for name in ("zero2_ckpt", "zero3_ckpt"):
        assert two[0][name]["mlp_calls"] == 2 * fsdp2_rank["mlp_calls"] > 0
        _assert_same_step(plain, two[0][name], name, 1e-4, 2e-5)
    # the head in slices inside ZeRO-3's gathered head, recomputed in backward (test below)
    _assert_same_step(plain, two[0]["zero3_sliced"], "zero3_sliced", 1e-4, 2e-5)
    assert two[0]["zero3_sliced"]["mlp_calls"] > fsdp2_rank["mlp_calls"]


def test_sliced_logits_and_token_budget_train_like_whole_ones(trained):
    """learner.logits_chunk_tokens=3 and max_tokens_per_micro_batch=19 on 2 FSDP2 ranks: the
    head runs inside the sharded root's forward, slice by slice and again in backward, over
    more, smaller micro-batches; log-probabilities, loss, grad norm and weights are one
    process's with the whole logits of one micro-batch, within the 2-rank tolerance."""
    sliced, plain = trained[2][0]["sliced"], trained[1][0]["plain"]
    assert sliced["mlp_calls"] > trained[2][0]["plain"]["mlp_calls"]  # more micro-batches
    np.testing.assert_allclose(
        _logprobs(trained[2], "sliced"), _logprobs(trained[1], "plain"), atol=1e-5
    )
    _assert_same_step(plain, sliced, "2 ranks sliced vs 1 whole", 1e-4, 2e-5)
