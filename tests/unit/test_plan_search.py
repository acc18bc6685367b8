"""``rlsys plan --cluster``: layouts within memory, ranked by simulated samples/s, printed as
overrides that rlsys's config validation accepts, that lay out soundly on the cluster's GPUs
and that set what the cost model priced."""

from __future__ import annotations

import dataclasses
import time

import pytest

from rlsys.placement.check import predict, violations
from rlsys.plan.command import main as plan_main
from rlsys.plan.hardware import ASSUMED, GB, GPUS, MODELS, Cluster, parse_model
from rlsys.plan.layout import MIXED_BF16, Precision, row_tokens
from rlsys.plan.memory import activation_bytes_per_token, fit_micro_batch, learner_state_bytes
from rlsys.plan.pricing import stage_costs, sync_stages
from rlsys.plan.search import Ranked, commands, layouts, plan_commands, search, tp_sizes
from rlsys.plan.workload import ReplyLengths, Workload, WorkloadError
from rlsys.resolve import load_config

H100_64 = Cluster(8, 8, "H100")
WORK = Workload(
    batch_size=256, n_samples=8, lengths=ReplyLengths.parse("mean=600,max=4096"), prompt_tokens=256
)
# (cluster, model): the 2 x 4 H100 with the 0.5B, a 7B on one 8-GPU node, one GPU
# (CUDA IPC), an A100 node with a Llama, and a 32B that needs activation checkpointing
PLANS = [
    ("nodes=2,gpus_per_node=4,gpu=H100", "qwen2.5-0.5b"),
    ("nodes=1,gpus_per_node=8,gpu=H100", "qwen2.5-7b"),
    ("nodes=1,gpus_per_node=1,gpu=H100", "qwen2.5-0.5b"),
    ("nodes=1,gpus_per_node=8,gpu=A100", "llama3-8b"),
    ("nodes=8,gpus_per_node=8,gpu=H100", "qwen2.5-32b"),
]


def _ranked(cluster: str, model: str, top: int = 3) -> tuple[Cluster, list[Ranked]]:
    c = Cluster.parse(cluster)
    return c, search(c, parse_model(model), WORK, top=top)


def test_models_carry_their_published_shapes():
    small, seven = MODELS["qwen2.5-0.5b"], MODELS["qwen2.5-7b"]
    assert (small.layers, small.hidden, small.heads, small.kv_heads, small.vocab) == (
        24, 896, 14, 2, 151936,
    )  # fmt: skip
    assert small.head_dim == 64 and seven.head_dim == 128
    assert [tp for tp in (1, 2, 4, 8) if small.splits_over(tp)] == [1, 2]
    assert [tp for tp in (1, 2, 4, 8) if seven.splits_over(tp)] == [1, 2, 4]  # 28 heads, 4 KV
    assert MODELS["llama3-8b"].splits_over(8)
    custom = parse_model(
        "params=7.61e9,layers=28,hidden=3584,heads=28,kv_heads=4,intermediate=18944,vocab=152064"
    )
    assert dataclasses.replace(custom, hub_id=seven.hub_id) == seven


def test_tensor_parallelism_only_where_the_heads_divide_and_within_a_node():
    for model in MODELS.values():
        for cluster in (Cluster(1, 8, "H100"), Cluster(2, 4, "H100"), Cluster(3, 6, "H200")):
            for tp in tp_sizes(cluster, model):
                assert model.heads % tp == 0 and model.kv_heads % tp == 0
                assert cluster.gpus_per_node % tp == 0
    assert tp_sizes(Cluster(1, 8, "H100"), MODELS["qwen2.5-7b"]) == [1, 2, 4]  # not 8
    assert tp_sizes(Cluster(2, 4, "H100"), MODELS["qwen2.5-0.5b"]) == [1, 2]


def test_published_figures_give_first_order_costs():
    model, cluster = MODELS["qwen2.5-7b"], Cluster(1, 8, "H100")
    split = sorted(
        (lay for lay in layouts(cluster, model, WORK) if not lay.colocated),
        key=lambda lay: lay.learner_ranks,
    )
    by_tp = {lay.engine_tp: lay for lay in split}  # the most learner ranks each
    one, four = (stage_costs(by_tp[tp], cluster, WORK) for tp in (1, 4))
    assert not by_tp[1].activation_checkpointing
    assert one.train_token_s == pytest.approx(3 * one.logprob_token_s)  # 6P vs 2P FLOPs
    recompute = dataclasses.replace(by_tp[1], activation_checkpointing=True)
    assert stage_costs(recompute, cluster, WORK).train_token_s == pytest.approx(
        4 * one.logprob_token_s
    )
    assert four.gen_token_s < one.gen_token_s and four.gen_step_s < one.gen_step_s
    # 7.6B bf16 engine weights read once per decode step at 70% of 3.35 TB/s
    assert one.gen_step_s == pytest.approx(2 * 7.61e9 / (3350e9 * 0.7))
    # the learner computes rows padded to prompt + the longest reply
    padding = row_tokens(WORK) / (256 + WORK.lengths.mean)
    assert one.logprob_token_s == pytest.approx(2 * 7.61e9 * padding / (989e12 * 0.4))


def test_weight_transports_follow_the_gpu_rules_and_are_priced_as_such():
    model, cluster = MODELS["qwen2.5-0.5b"], Cluster(2, 4, "H100")
    found = layouts(cluster, model, WORK)
    assert {lay.transport for lay in found if lay.colocated} == {"object_store"}
    assert {lay.transport for lay in found if not lay.colocated} == {"collective"}
    (single,) = layouts(Cluster(1, 1, "H100"), model, WORK)
    assert single.colocated and single.transport == "cuda_ipc"
    colocated = next(lay for lay in found if lay.colocated and lay.engine_tp == 1)
    stages = dict(sync_stages(colocated, cluster))
    # host copies through Ray's object store, not NVLink: at most the host-copy bandwidth
    assert "into the object store" in stages and "NCCL broadcast" not in stages
    per_byte = stage_costs(colocated, cluster, WORK).sync_byte_s
    assert per_byte > 1 / (ASSUMED["host_copy_gb_per_s"] * GB)
    split = next(lay for lay in found if not lay.colocated and lay.engine_tp == 1)
    assert stage_costs(split, cluster, WORK).sync_byte_s < per_byte
    # a weight update carries the learner's fp32 master weights
    assert colocated.sync_bytes == 4 * model.params


def test_memory_model_sizes_the_micro_batch_and_checkpoints_only_when_needed():
    h100, row = GPUS["H100"], row_tokens(WORK)
    assert learner_state_bytes(MODELS["qwen2.5-7b"], MIXED_BF16, 8) == 16 * 7.61e9 / 8
    bf16 = Precision("bfloat16", None, "bfloat16", "bf16")
    assert learner_state_bytes(MODELS["qwen2.5-7b"], bf16, 8) == 8 * 7.61e9 / 8
    small = MODELS["qwen2.5-0.5b"]
    # per layer 7ah + 8h + 2a kv + 4aI bytes per token (a = 2, bf16 compute)
    per_layer = 7 * 2 * 896 + 8 * 896 + 2 * 2 * 128 + 4 * 2 * 4864
    assert activation_bytes_per_token(small, MIXED_BF16, False) == 24 * per_layer
    micro = fit_micro_batch(h100, small, MIXED_BF16, 4, row)
    assert micro is not None and not micro.checkpointing
    assert micro.tokens >= row and micro.rows == micro.tokens // row
    big = fit_micro_batch(h100, MODELS["qwen2.5-32b"], MIXED_BF16, 56, row)
    assert big is not None and big.checkpointing  # a row without it does not fit
    assert fit_micro_batch(h100, MODELS["llama3-70b"], MIXED_BF16, 8, row) is None


def test_every_layout_fits_the_cluster_and_its_memory():
    model = MODELS["qwen2.5-32b"]
    found = layouts(H100_64, model, WORK)
    assert found
    for lay in found:
        assert lay.gpus == 64 and lay.rollout_gpus % lay.engine_tp == 0
        assert lay.micro_batch_tokens >= row_tokens(WORK)
        assert lay.max_num_seqs >= WORK.n_samples and 0 < lay.engine_memory_frac <= 0.9
        assert lay.colocated <= (lay.max_staleness == 0)


@pytest.mark.parametrize(("cluster", "model"), PLANS)
def test_every_printed_command_loads_places_soundly_and_sets_what_was_priced(cluster, model):
    c, ranked = _ranked(cluster, model)
    assert ranked
    for r in ranked:
        lay = r.candidate.layout
        cfg = load_config(lay.overrides(WORK))  # every cross-check of rlsys train
        assert violations(cfg, predict(cfg, c.node_gpus)) == []
        # (b) the printed tensor-parallel size splits the heads, within a node
        tp = cfg.rollout.vllm.tensor_parallel_size
        head = parse_model(model)
        assert head.heads % tp == 0 and head.kv_heads % tp == 0 and tp <= c.gpus_per_node
        # (c) what the run does is what was priced
        assert cfg.weight_sync.transport == lay.transport
        precision = (cfg.model.dtype, cfg.learner.mixed_precision, cfg.rollout.dtype)
        assert precision == ("float32", "bfloat16", "bfloat16")
        p = lay.precision
        assert precision == (p.model_dtype, p.compute_dtype, p.engine_dtype)
        assert (cfg.placement.mode == "colocated") == lay.colocated == cfg.engines_sleep
        assert cfg.rollout.num_workers == lay.engines
        assert cfg.rollout.num_gpus_per_worker == tp == lay.engine_tp
        assert cfg.learner.world_size == lay.learner_ranks and cfg.learner.num_gpus_per_rank == 1
        learner = cfg.learner
        assert learner.activation_checkpointing == lay.activation_checkpointing
        assert learner.max_tokens_per_micro_batch == lay.micro_batch_tokens
        assert learner.micro_batch_size * row_tokens(WORK) <= lay.micro_batch_tokens
        assert (learner.ppo_epochs, learner.num_mini_batches) == (1, 1)
        assert cfg.rollout.vllm.gpu_memory_utilization == lay.engine_memory_frac
        assert cfg.buffer.max_staleness == lay.max_staleness
        assert cfg.algorithm.off_policy == lay.off_policy
        # the price follows the printed config: re-priced from its values, the same costs
        from_cfg = dataclasses.replace(
            lay,
            transport=cfg.weight_sync.transport,
            activation_checkpointing=learner.activation_checkpointing,
            engine_tp=cfg.rollout.num_gpus_per_worker,
            colocated=cfg.placement.mode == "colocated",
        )
        assert stage_costs(from_cfg, c, WORK) == r.candidate.costs


def test_plan_commands_are_what_the_command_prints(capsys):
    argv = ["--cluster", "nodes=2,gpus_per_node=4,gpu=H100", "--model", "qwen2.5-0.5b"]
    listed = plan_commands([*argv, "--top", "3"])
    assert len(listed) == 3
    assert plan_main([*argv, "--top", "3"]) == 0
    printed = [
        line.split("rlsys train ", 1)[1].split()
        for line in capsys.readouterr().out.splitlines()
        if "rlsys train " in line
    ]
    assert printed == listed
    c = Cluster.parse(argv[1])
    assert commands(c, parse_model(argv[3]), WORK, top=3) == listed  # WORK: the defaults
    for overrides in listed:
        cfg = load_config(overrides)
        assert violations(cfg, predict(cfg, c.node_gpus)) == []


def test_the_worked_examples_run_in_under_ten_seconds(capsys):
    for cluster, model in [
        ("nodes=8,gpus_per_node=8,gpu=H100", "qwen2.5-7b"),
        ("nodes=64,gpus_per_node=8,gpu=H100", "qwen2.5-32b"),
    ]:
        started = time.perf_counter()
        assert plan_main(["--cluster", cluster, "--model", model, "--top", "3"]) == 0
        assert time.perf_counter() - started < 10
        out = capsys.readouterr().out
        assert out.count("rlsys train placement=") == 3
        assert "published figures" in out


def test_a_model_too_big_for_the_cluster_says_so():
    with pytest.raises(WorkloadError, match="no placement"):
        search(Cluster(1, 8, "H100"), MODELS["llama3-70b"], WORK)


def test_bad_cluster_and_model_specs_name_the_flag(capsys):
    with pytest.raises(WorkloadError, match="--cluster"):
        Cluster.parse("nodes=8,gpu=H100")
    with pytest.raises(WorkloadError, match="known GPUs"):
        Cluster.parse("nodes=1,gpus_per_node=8,gpu=B9000")
    assert plan_main(["--cluster", "nodes=1,gpus_per_node=8,gpu=H100", "--model", "gpt5"]) == 2
    err = capsys.readouterr().err
    assert "--model 'gpt5'" in err and "qwen2.5-0.5b" in err and "kv_heads=N" in err
    with pytest.raises(WorkloadError, match="heads"):
        parse_model("params=1e9,layers=2,hidden=900,heads=14,kv_heads=2,intermediate=8,vocab=8")
