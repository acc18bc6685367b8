"""FSDP2 in real processes: on gloo, 2 ranks train exactly like 1 and weights gather in
buckets; on NCCL (1 and 2 GPUs), a step matches one CPU process's."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from backend_harness import run_ranks, toy_batch

from rlsys.algorithms.objectives import PolicyObjective, SFTObjective, ValueObjective
from rlsys.algorithms.policy_losses import ClipSettings, SequenceClipSettings
from rlsys.backends.data_parallel import packed_forward_plan
from rlsys.backends.packing import PackInputs
from rlsys.config.learner import OptimConfig


def _train(rank, world_size, model_dir, cases, bucket_bytes, device="cpu", compiler=None):
    """Per case: forward, one train_step of 2 mini-batches, the full weights in buckets (a fresh
    backend each; one set of processes serves every case, as process start-up dominates).
    ``device="cuda"``: rank r trains on GPU r (run_ranks with backend="nccl"). ``compiler``:
    the torch.compile backend of ppo_compiled (default: inductor on a GPU, CPU_COMPILER here)."""
    from rlsys.backends.fsdp import FSDP2Backend
    from rlsys.models.blocks import decoder_layers

    out = {}
    for case in cases:
        batch = toy_batch(
            model_dir, mixed=case in MIXED, grouped=case in GROUPED, inert=8 * (case in INERT)
        )
        objective, role = OBJECTIVES[case]
        backend = FSDP2Backend(
            model_dir,
            "float32",
            OptimConfig(lr=1e-3, warmup_steps=0),
            micro_batch_size=2,
            temperature=1.0,
            device=torch.device("cuda", rank) if device == "cuda" else torch.device("cpu"),
            role=role,
            mixed_precision="bfloat16" if case == "ppo_bf16" else None,
            compile_backend=(compiler or _default_compiler(device))
            if case == "ppo_compiled"
            else None,
            packing=case in PACKED,
            share_prompts=case in GROUPED,
            skip_zero_advantage=case in SKIPPED,
        )
        forward = backend.forward_logprobs if role == "policy" else backend.forward_values
        rows, logprobs = forward(batch)
        case_batch, mini = batch, 2
        if case in SINGLE_STEP:  # one optimizer step: old logprobs from a pass, or from none
            case_batch, mini = dataclasses.replace(batch), 1
            case_batch.old_logprobs = logprobs if case == "ppo_pass" else None
        metrics = backend.train_step(case_batch, objective, num_mini_batches=mini, epochs=1, seed=0)
        buckets = list(backend.iter_weight_buckets(bucket_bytes))
        state = {k: v.cpu() for b in buckets for k, v in b.items()}
        out[case] = {
            "rows": rows,
            "logprobs": logprobs,
            "metrics": metrics,
            "state": state,
            "sizes": [sum(t.numel() * t.element_size() for t in b.values()) for b in buckets],
            "biggest": max((t.numel() * t.element_size() for t in state.values()), default=0),
            "n_buckets": len(buckets),
            "attention": backend.module.config._attn_implementation,
            "compiled_layers": sum(  # layers set to run as torch.compile'd code
                layer._compiled_call_impl is not None for layer in decoder_layers(backend.module)
            ),
            # graphs dynamo compiled in this process so far (eager cases add none)
            "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
            "optim_dtypes": {
                v.dtype for st in backend.optimizer.state.values() for v in st.values()
            },
        }
    return out


# On CPU, CI compiles with aot_eager: dynamo traces each layer under FSDP2's hooks and AOTAutograd
# splits forward and backward as with inductor, without inductor writing and building C++ (84 s
# of a fresh 2-core machine's CI, its cache empty). Inductor on CPU: the long-tier test below.
CPU_COMPILER = "aot_eager"


def _default_compiler(device: str) -> str:
    return "inductor" if device == "cuda" else CPU_COMPILER


def _logprobs(results: list[dict], case: str) -> np.ndarray:
    """The forward pass's rows, gathered from every rank."""
    logprobs = np.zeros((11, results[0][case]["logprobs"].shape[1]), np.float32)
    for part in results:
        logprobs[part[case]["rows"]] = part[case]["logprobs"]
    return logprobs


OBJECTIVES = {
    "sft": (SFTObjective(), "policy"),
    "ppo": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    "gspo": (
        PolicyObjective("gspo", SequenceClipSettings(3e-4, 4e-4), loss_agg="seq_mean_token_mean"),
        "policy",
    ),
    "dr_grpo": (PolicyObjective(loss_agg="seq_sum_norm", loss_agg_norm=8.0), "policy"),
    "critic": (ValueObjective(clip=0.2), "value"),
    # one optimizer step on the batch, its old logprobs from the forward pass before it
    # (ppo_pass; on one rank, which holds every row) or from the training pass (ppo_fused)
    "ppo_pass": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    "ppo_fused": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    "ppo_bf16": (
        PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)),
        "policy",
    ),  # learner.mixed_precision=bfloat16
    "ppo_compiled": (
        PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)),
        "policy",
    ),  # learner.compile=true
    # learner.packing=true on 2 ranks against unpacked on one, on rows of mixed lengths
    "ppo_packed": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    "ppo_mixed": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    "critic_packed": (ValueObjective(clip=0.2), "value"),
    "critic_mixed": (ValueObjective(clip=0.2), "value"),
    # learner.share_prompts: packed with each group's prompt once, on rows in groups of 4
    "ppo_shared": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    "ppo_grouped": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    # learner.skip_zero_advantage on 2 ranks against every row trained on one, 8 of 11 rows
    # inert: a rank may hold none of a mini-batch's trained rows
    "ppo_skip": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
    "ppo_inert": (PolicyObjective(loss_settings=ClipSettings(dual_clip=3.0)), "policy"),
}
SINGLE_STEP = ("ppo_pass", "ppo_fused")
# case: its unpacked twin
PACKED = {"ppo_packed": "ppo_mixed", "critic_packed": "critic_mixed", "ppo_shared": "ppo_grouped"}
SKIPPED = {"ppo_skip": "ppo_inert"}  # case: its twin training every row
INERT = ("ppo_skip", "ppo_inert")  # on toy_batch(inert=8)
MIXED = ("ppo_packed", "ppo_mixed", "critic_packed", "critic_mixed")  # on toy_batch(mixed=True)
GROUPED = ("ppo_shared", "ppo_grouped")  # on toy_batch(grouped=True), shared if packed
ONE_RANK_ONLY = ("ppo_pass", "ppo_bf16", *PACKED.values(), *SKIPPED.values())
# compiling costs ~20 s a process: once, sharded; packing and skipping are checked against
# one rank
TWO_RANKS_ONLY = ("ppo_compiled", *PACKED, *SKIPPED)


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory) -> tuple[list[dict], list[dict]]:
    """Every case trained on 1 rank and on 2 ranks (ONE_RANK_ONLY and TWO_RANKS_ONLY cases on
    one of them): what each rank returned."""
    tmp = tmp_path_factory.mktemp("fsdp")
    one_rank = [c for c in OBJECTIVES if c not in TWO_RANKS_ONLY]
    one = run_ranks(_train, 1, tmp / "ws1", tiny_model_dir, one_rank, 1 << 30)
    two_ranks = [c for c in OBJECTIVES if c not in ONE_RANK_ONLY]
    two = run_ranks(_train, 2, tmp / "ws2", tiny_model_dir, two_ranks, 1 << 30)
    return one, two


@pytest.mark.parametrize("case", [c for c in OBJECTIVES if c not in ONE_RANK_ONLY + TWO_RANKS_ONLY])
def test_two_ranks_train_exactly_like_one(tiny_model_dir, trained, case):
    """Every loss aggregation (token mean, sequence means, constant normaliser) and the critic
    give one process's loss, gradient and update when sharded over 2 ranks."""
    role = OBJECTIVES[case][1]
    one, two = trained[0][0][case], trained[1][0][case]
    np.testing.assert_allclose(_logprobs(trained[0], case), _logprobs(trained[1], case), atol=1e-5)
    assert one["metrics"]["trained_tokens"] == two["metrics"]["trained_tokens"]
    assert one["metrics"]["loss"] == pytest.approx(two["metrics"]["loss"], rel=1e-4)
    assert one["metrics"]["grad_norm"] == pytest.approx(two["metrics"]["grad_norm"], rel=1e-4)
    assert one["state"].keys() == two["state"].keys()
    for name, tensor in one["state"].items():
        torch.testing.assert_close(
            two["state"][name],
            tensor,
            atol=2e-5,
            rtol=1e-4,
            msg=f"parameter {name} differs after one step",
        )
    from rlsys.models.loading import load_model
    from rlsys.models.value import load_value_model

    loader = load_model if role == "policy" else load_value_model
    before = loader(tiny_model_dir).state_dict()
    moved = [n for n, t in one["state"].items() if not torch.equal(t, before[n])]
    assert len(moved) == len(one["state"])  # every parameter was trained


def test_two_ranks_skipping_inert_rows_train_like_one_training_all(trained):
    """learner.skip_zero_advantage on 2 ranks, 8 of 11 rows inert: the loss's normaliser
    (trained_tokens), grad norm and update of one rank computing every row."""
    one, two = trained[0][0]["ppo_inert"], trained[1][0]["ppo_skip"]
    assert two["metrics"]["skipped_rows_frac"] == pytest.approx(8 / 11)
    assert "skipped_rows_frac" not in one["metrics"]
    assert one["metrics"]["trained_tokens"] == two["metrics"]["trained_tokens"]
    assert one["metrics"]["grad_norm"] == pytest.approx(two["metrics"]["grad_norm"], rel=1e-4)
    for name, tensor in one["state"].items():
        torch.testing.assert_close(two["state"][name], tensor, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("case", list(PACKED))
def test_packed_two_ranks_train_like_one_unpacked(tiny_model_dir, trained, case):
    """learner.packing on 2 ranks: the unpacked one-rank log-probabilities (values) where the
    loss reads them, loss, grad norm and update."""
    one, two = trained[0][0][PACKED[case]], trained[1][0][case]
    grouped = case in GROUPED
    batch = toy_batch(tiny_model_dir, mixed=not grouped, grouped=grouped)
    pack = PackInputs.of(batch.input_ids, batch.attention_mask, batch.loss_mask, grouped)
    assert (pack.prompts is not None) == grouped
    plans = [packed_forward_plan(pack, batch.input_ids.shape[1], 2, r, 2) for r in range(2)]
    assert any(len(set(packed)) < len(rows) for p in plans for rows, packed in p)  # shared
    scored = batch.loss_mask > 0
    want, got = _logprobs(trained[0], PACKED[case]), _logprobs(trained[1], case)
    np.testing.assert_allclose(got[scored], want[scored], atol=1e-5)
    assert one["metrics"]["trained_tokens"] == two["metrics"]["trained_tokens"]
    assert one["metrics"]["loss"] == pytest.approx(two["metrics"]["loss"], rel=1e-4)
    assert one["metrics"]["grad_norm"] == pytest.approx(two["metrics"]["grad_norm"], rel=1e-4)
    for name, tensor in one["state"].items():
        torch.testing.assert_close(two["state"][name], tensor, atol=2e-5, rtol=1e-4, msg=name)


def test_weight_buckets_respect_the_size_limit_and_send_tied_weights_once(tmp_path):
    from rlsys.config.schema import ModelConfig
    from rlsys.models.builtin import builtin_dir

    tied_dir = str(builtin_dir(ModelConfig(tie_word_embeddings=True)))
    limit = 64 * 1024
    out = run_ranks(_train, 2, tmp_path, tied_dir, ["sft"], limit)[0]["sft"]
    assert out["n_buckets"] > 3
    assert all(size <= max(limit, out["biggest"]) for size in out["sizes"])
    # tied embeddings are sent once
    assert "lm_head.weight" not in out["state"] and "model.embed_tokens.weight" in out["state"]


def test_one_step_takes_its_old_logprobs_from_the_training_pass(tiny_model_dir, trained):
    """With one optimizer step per batch the separate pre-update pass is redundant: the update
    without it (old logprobs = the training pass's, detached) has the same loss, gradient and
    weights, and reports the engine/learner mismatch the controller computes from the pass."""
    with_pass, fused = trained[0][0]["ppo_pass"], trained[0][0]["ppo_fused"]
    for key in ("loss", "grad_norm", "trained_tokens", "clip_frac"):
        assert fused["metrics"][key] == pytest.approx(with_pass["metrics"][key], rel=1e-5, abs=1e-7)
    assert "logprob_mismatch" not in with_pass["metrics"]
    batch = toy_batch(tiny_model_dir)
    mask = batch.loss_mask > 0
    mismatch = np.abs(batch.behaviour_logprobs - with_pass["logprobs"])[mask].mean()
    assert fused["metrics"]["logprob_mismatch"] == pytest.approx(mismatch, rel=1e-5)
    for name, tensor in with_pass["state"].items():
        torch.testing.assert_close(fused["state"][name], tensor, atol=1e-6, rtol=1e-5, msg=name)


def test_mixed_precision_keeps_fp32_weights_and_close_logprobs(trained):
    """learner.mixed_precision=bfloat16: forward passes under bf16 autocast with attention in
    fp32 (rlsys/models/attention.py), while the weights and AdamW state stay fp32; the
    log-probabilities and the step stay close to the fp32 learner's from the same weights."""
    from rlsys.models.attention import FP32_SDPA

    _check_bf16(trained[0], trained[0], attention=FP32_SDPA)


def _check_bf16(fp32_ranks: list[dict], bf16_ranks: list[dict], attention: str) -> None:
    """``attention``: the bf16 learner's attention implementation (fp32 SDPA on CPU only)."""
    fp32, bf16 = fp32_ranks[0]["ppo"], bf16_ranks[0]["ppo_bf16"]
    assert bf16["attention"] == attention and fp32["attention"] == "sdpa"
    assert {t.dtype for t in bf16["state"].values()} == {torch.float32}
    assert bf16["optim_dtypes"] == {torch.float32}  # exp_avg, exp_avg_sq and step
    gap = np.abs(_logprobs(bf16_ranks, "ppo_bf16") - _logprobs(fp32_ranks, "ppo"))
    assert 0 < gap.mean() < 0.02 and gap.max() < 0.5  # bf16 differs, but only a little
    assert bf16["metrics"]["loss"] == pytest.approx(fp32["metrics"]["loss"], abs=0.02)
    assert bf16["metrics"]["grad_norm"] == pytest.approx(fp32["metrics"]["grad_norm"], rel=0.05)
    moved = [n for n, t in bf16["state"].items() if not torch.equal(t, fp32["state"][n])]
    assert moved  # a bf16 pass gives different (close) gradients, so a different step


def test_compiled_layers_train_like_eager_ones(trained):
    """learner.compile=true: decoder layers compiled in place under FSDP2 on 2 ranks give the
    eager single-process forward pass, loss, gradient and step, and the same parameter names
    (the weights the engine and checkpoints see)."""
    _check_compiled(trained[0], trained[1], atol=1e-5)


@pytest.mark.long
def test_inductor_compiled_layers_train_like_eager_ones(trained, tiny_model_dir, tmp_path):
    """As above with inductor's C++ kernels on CPU (the default learner.compile_backend)."""
    compiled = run_ranks(
        _train, 2, tmp_path, tiny_model_dir, ["ppo_compiled"], 1 << 30, "cpu", "inductor"
    )
    _check_compiled(trained[0], compiled, atol=1e-5)


def _check_compiled(eager_ranks: list[dict], compiled_ranks: list[dict], atol: float) -> None:
    """``atol`` bounds the log-prob gap; weights get twice it (CPU) and the metrics 1e-4
    relative: compiled kernels only reorder fp32 sums."""
    eager, compiled = eager_ranks[0]["ppo"], compiled_ranks[0]["ppo_compiled"]
    assert compiled["compiled_layers"] == 2 and eager["compiled_layers"] == 0
    assert compiled["graphs"] > 0 and eager["graphs"] == 0  # compiled code did run
    np.testing.assert_allclose(
        _logprobs(compiled_ranks, "ppo_compiled"), _logprobs(eager_ranks, "ppo"), atol=atol
    )
    for key in ("loss", "grad_norm", "trained_tokens", "clip_frac"):
        assert compiled["metrics"][key] == pytest.approx(eager["metrics"][key], rel=1e-4, abs=1e-7)
    assert compiled["state"].keys() == eager["state"].keys()
    for name, tensor in eager["state"].items():
        torch.testing.assert_close(
            compiled["state"][name], tensor, atol=2 * atol, rtol=1e-4, msg=name
        )


def _gpus_for(world_size: int):
    """A GPU test of ``world_size`` ranks, skipped where this machine has fewer GPUs."""
    have = torch.cuda.device_count()
    return pytest.param(
        world_size,
        id=f"{world_size}gpu",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(
                0 < have < world_size,
                reason=f"needs {world_size} CUDA GPUs (one per NCCL rank); this machine has {have}",
            ),
        ],
    )


@pytest.mark.parametrize("world_size", [_gpus_for(1), _gpus_for(2)])
def test_fsdp2_on_nccl_trains_like_one_cpu_process(tiny_model_dir, tmp_path, world_size):
    """FSDP2 over NCCL gives one CPU process's forward pass (log-probs; the critic's values),
    loss, gradient and step, up to the order in which CUDA and CPU kernels sum in fp32:
    log-probs within 1e-4, loss within 1e-4 and gradient norm within 1e-3 (relative), weights
    within 1e-4 (a tenth of the lr: each AdamW step moves a weight by about lr, so a wrong
    update cannot hide in the tolerance)."""
    cases = ["sft", "ppo", "critic"]
    cpu = run_ranks(_train, 1, tmp_path / "cpu", tiny_model_dir, cases, 1 << 30)
    gpu = run_ranks(
        _train,
        world_size,
        tmp_path / "nccl",
        tiny_model_dir,
        cases,
        1 << 30,
        "cuda",
        backend="nccl",
    )
    for case in cases:
        want, got = cpu[0][case], gpu[0][case]
        np.testing.assert_allclose(_logprobs(gpu, case), _logprobs(cpu, case), atol=1e-4)
        assert got["metrics"]["trained_tokens"] == want["metrics"]["trained_tokens"]
        assert got["metrics"]["loss"] == pytest.approx(want["metrics"]["loss"], rel=1e-4)
        assert got["metrics"]["grad_norm"] == pytest.approx(want["metrics"]["grad_norm"], rel=1e-3)
        assert got["state"].keys() == want["state"].keys()
        for name, tensor in want["state"].items():
            torch.testing.assert_close(
                got["state"][name], tensor, atol=1e-4, rtol=1e-3, msg=f"{case}: {name} differs"
            )


@pytest.mark.gpu
def test_mixed_precision_and_compiled_layers_on_one_gpu(tiny_model_dir, tmp_path):
    """learner.mixed_precision=bfloat16 and learner.compile=true on a CUDA rank (NCCL): the
    same checks as on CPU against the GPU's own fp32 eager step, except that attention stays
    in bf16 kernels and compiled code (Triton kernels) gets the NCCL test's 1e-4 bounds."""
    ranks = run_ranks(
        _train,
        1,
        tmp_path,
        tiny_model_dir,
        ["ppo", "ppo_bf16"],
        1 << 30,
        "cuda",
        backend="nccl",
    )
    _check_bf16(ranks, ranks, attention="sdpa")  # GPUs keep their bf16 attention kernels
    # a fresh process: the graph counter of the eager case must start at zero
    compiled = run_ranks(
        _train,
        1,
        tmp_path / "compiled",
        tiny_model_dir,
        ["ppo_compiled"],
        1 << 30,
        "cuda",
        backend="nccl",
    )
    _check_compiled(ranks, compiled, atol=1e-4)
