"""DeepSpeed ZeRO-2/3 on gloo in real processes: 2 ranks train exactly like 1 and like FSDP2,
ZeRO-3 gathers weights in buckets, and (both backends) a non-finite grad norm skips the step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from backend_harness import NO_DEEPSPEED, build, full_state, run_ranks, toy_batch

from rlsys.algorithms.objectives import PolicyObjective, SFTObjective, ValueObjective
from rlsys.algorithms.policy_losses import ClipSettings

OBJECTIVES = {
    "policy": PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)),
    "value": ValueObjective(clip=0.2),
}
BUCKET_LIMIT = 64 * 1024


def _train(rank, world_size, model_dir, kinds):
    """Per (kind, role): forward before training, one train_step of 2 mini-batches (lr warms
    up over them), full weights in small buckets."""
    batch = toy_batch(model_dir)
    out = {}
    for kind in kinds:
        for role, objective in OBJECTIVES.items():
            backend = build(kind, model_dir, role, warmup_steps=2)
            forward = backend.forward_logprobs if role == "policy" else backend.forward_values
            rows, values = forward(batch)
            metrics = backend.train_step(batch, objective, num_mini_batches=2, epochs=1, seed=0)
            buckets = list(backend.iter_weight_buckets(BUCKET_LIMIT))
            out[kind, role] = {
                "rows": rows,
                "values": values,
                "metrics": metrics,
                "state": {k: v.clone() for b in buckets for k, v in b.items()},
                "sizes": [sum(t.numel() * t.element_size() for t in b.values()) for b in buckets],
            }
    if kinds[0] != "fsdp2":  # DeepSpeed's shm all-reduce op, only for inference: never built
        from deepspeed.comm import comm

        out["shm_op_built"] = comm.cdb.shm_comm_op is not None
    return out


def _gather_rows(results, key):
    values = np.zeros((11, results[0][key]["values"].shape[1]), np.float32)
    for part in results:
        values[part[key]["rows"]] = part[key]["values"]
    return values


def _assert_same_training(one, two, what):
    assert one["metrics"]["trained_tokens"] == two["metrics"]["trained_tokens"]
    assert one["metrics"]["skipped_steps"] == two["metrics"]["skipped_steps"] == 0
    assert one["metrics"]["lr"] == two["metrics"]["lr"] == pytest.approx(1e-3)
    assert one["metrics"]["loss"] == pytest.approx(two["metrics"]["loss"], rel=1e-4), what
    assert one["metrics"]["grad_norm"] == pytest.approx(two["metrics"]["grad_norm"], rel=1e-4)
    assert one["state"].keys() == two["state"].keys()
    for name, tensor in one["state"].items():
        torch.testing.assert_close(
            two["state"][name], tensor, atol=2e-5, rtol=1e-4, msg=f"{what}: {name} differs"
        )


@pytest.mark.parametrize("kind", ["zero2", "zero3"])
def test_deepspeed_two_ranks_train_exactly_like_one_and_like_fsdp(tiny_model_dir, tmp_path, kind):
    """Policy and critic: ZeRO over 2 ranks gives one process's forward, loss, grad norm and
    update, and one DeepSpeed process matches one FSDP2 process (same AdamW, clipping and
    warm-up); ZeRO-3's bucketed gather respects the size limit."""
    pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    one = run_ranks(_train, 1, tmp_path / "ws1", tiny_model_dir, [kind, "fsdp2"])[0]
    two = run_ranks(_train, 2, tmp_path / "ws2", tiny_model_dir, [kind])
    from rlsys.models.loading import load_model

    before = load_model(tiny_model_dir).state_dict()
    assert not one["shm_op_built"] and not two[0]["shm_op_built"]
    for role in OBJECTIVES:
        key = (kind, role)
        np.testing.assert_allclose(_gather_rows([one], key), _gather_rows(two, key), atol=1e-5)
        _assert_same_training(one[key], two[0][key], f"{kind} {role}: 1 vs 2 ranks")
        _assert_same_training(one["fsdp2", role], one[key], f"{kind} {role}: vs fsdp2")
        assert two[1][key]["state"] == {}  # only rank 0 keeps gathered weights
        sizes, biggest = (
            two[0][key]["sizes"],
            max(t.numel() * 4 for t in one[key]["state"].values()),
        )
        assert len(sizes) > 3 and all(size <= max(BUCKET_LIMIT, biggest) for size in sizes)
        if role == "policy":
            moved = [n for n, t in one[key]["state"].items() if not torch.equal(t, before[n])]
            assert len(moved) == len(before)  # every parameter was trained


@dataclass(frozen=True)
class PoisonedObjective:
    """Negative log-likelihood times NaN: every gradient, so the grad norm, is NaN."""

    loss_agg: str = "token_mean"
    loss_agg_norm: float | None = None
    entropy_grad: bool = False
    rows_per_group: int = 1

    def __call__(self, out, batch):
        loss, metrics = SFTObjective()(out, batch)
        return loss * float("nan"), metrics


def _nonfinite(rank, world_size, model_dir, setups):
    """Per (kind, dtype): a poisoned train_step, then a good one, against a fresh backend's
    good step."""
    batch = toy_batch(model_dir)
    out = {}
    for kind, dtype in setups:
        poisoned = build(kind, model_dir, dtype=dtype)
        before = full_state(poisoned)
        bad = poisoned.train_step(batch, PoisonedObjective(), 2, 1, seed=0)
        unchanged = full_state(poisoned)
        good = poisoned.train_step(batch, SFTObjective(), 2, 1, seed=1)
        after = full_state(poisoned)
        fresh = build(kind, model_dir, dtype=dtype)
        fresh_good = fresh.train_step(batch, SFTObjective(), 2, 1, seed=1)
        fresh_after = full_state(fresh)
        out[kind, dtype] = {
            "bad": bad,
            "good": good,
            "fresh_good": fresh_good,
            "untouched": all(torch.equal(before[n], unchanged[n]) for n in before),
            "same_as_fresh": all(torch.equal(after[n], fresh_after[n]) for n in after),
            "moved": any(not torch.equal(before[n], after[n]) for n in before),
            "steps": (poisoned.optimizer_steps, fresh.optimizer_steps),
        }
    return out


NONFINITE = {
    "fsdp2": [("fsdp2", "float32"), ("fsdp2", "bfloat16")],
    "deepspeed": [("zero2", "float32"), ("zero2", "bfloat16"), ("zero3", "float32")],
}


@pytest.mark.parametrize("backend", list(NONFINITE))
def test_nonfinite_grad_norm_skips_the_step_and_leaves_no_trace(tiny_model_dir, tmp_path, backend):
    """A NaN grad norm skips every optimizer step of the call (counted in skipped_steps) with
    weights and optimizer state untouched: the next good step equals a fresh backend's."""
    if backend == "deepspeed":
        pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    results = run_ranks(_nonfinite, 2, tmp_path, tiny_model_dir, NONFINITE[backend])[0]
    for setup, r in results.items():
        assert r["bad"]["skipped_steps"] == 2, setup
        assert not np.isfinite(r["bad"]["grad_norm"]), setup
        assert r["untouched"], f"{setup}: a skipped step changed the weights"
        assert r["good"]["skipped_steps"] == 0 and r["moved"], setup
        assert r["good"]["loss"] == r["fresh_good"]["loss"], setup
        assert r["same_as_fresh"], f"{setup}: the skipped step left optimizer state behind"
        assert r["steps"] == (2, 2), setup


@pytest.mark.long
def test_cpu_optimizer_offload_trains_like_the_device_optimizer(tiny_model_dir, tmp_path):
    """ZeRO-2/3 with DeepSpeedCPUAdam (optimizer offload) take the same steps as with AdamW
    (compiles the CPU Adam op once: ~40 s cold)."""
    pytest.importorskip("deepspeed", reason=NO_DEEPSPEED)
    kinds = ["zero2", "zero2_offload", "zero3", "zero3_offload"]
    out = run_ranks(_train, 2, tmp_path, tiny_model_dir, kinds)[0]
    for stage in ("zero2", "zero3"):
        for role in OBJECTIVES:
            _assert_same_training(out[stage, role], out[f"{stage}_offload", role], stage)


def test_backend_config_keys_validate_with_the_key_and_the_fix():
    """learner.backend and learner.deepspeed.* parse from overrides; bad values name the key."""
    from rlsys.config.errors import ConfigError
    from rlsys.resolve import load_config

    cfg = load_config(["learner.backend=deepspeed", "learner.deepspeed.zero_stage=3"])
    assert (cfg.learner.backend, cfg.learner.deepspeed.zero_stage) == ("deepspeed", 3)
    assert not cfg.learner.offload and cfg.critic.backend == "fsdp2"
    for override, key in [
        ("learner.deepspeed.zero_stage=1", "learner.deepspeed.zero_stage"),
        ("critic.backend=megatron", "critic.backend"),
    ]:
        with pytest.raises(ConfigError, match=key):
            load_config([override])
