"""``rlsys plan --cluster``: placements within memory, ranked by simulated samples/s, printed
as overrides that rlsys's own config validation accepts."""

from __future__ import annotations

import time

import pytest

from rlsys.config.loader import load_config
from rlsys.plan.command import main as plan_main
from rlsys.plan.hardware import GPUS, MODELS, costs_for, engine_max_seqs, learner_fits
from rlsys.plan.search import Cluster, candidates, overrides, search
from rlsys.plan.workload import ReplyLengths, Workload, WorkloadError

H100_64 = Cluster(8, 8, "H100")
WORK = Workload(
    batch_size=256, n_samples=8, lengths=ReplyLengths.parse("mean=600,max=4096"), prompt_tokens=256
)


def test_published_figures_give_first_order_costs():
    gpu, model = GPUS["H100"], MODELS["qwen2.5-7b"]
    one, four = (costs_for(gpu, model, tp, 8, 856, 8, 8, False) for tp in (1, 4))
    assert one.train_token_s == pytest.approx(4 * one.logprob_token_s)  # 8P vs 2P FLOPs
    assert four.gen_token_s < one.gen_token_s and four.gen_step_s < one.gen_step_s
    # 7.6B bf16 weights read once per decode step at 70% of 3.35 TB/s
    assert one.gen_step_s == pytest.approx(2 * 7.62e9 / (3350e9 * 0.7))
    assert not learner_fits(gpu, MODELS["llama3-70b"], 8)  # 16 B/param over 8 x 80 GB
    assert learner_fits(gpu, MODELS["llama3-70b"], 64)
    assert engine_max_seqs(gpu, MODELS["llama3-70b"], 1, 1000) == 0  # 141 GB of weights


def test_every_candidate_fits_the_cluster_and_its_memory():
    model = MODELS["qwen2.5-32b"]
    found = candidates(H100_64, model, WORK)
    assert found
    for c in found:
        assert c.rollout_gpus + (0 if c.placement.colocated else c.learner_gpus) == 64
        assert learner_fits(H100_64.gpu, model, c.learner_gpus)
        assert c.max_num_seqs >= WORK.n_samples
        assert c.placement.colocated <= (c.placement.max_staleness == 0)


def test_search_ranks_placements_and_prints_overrides_rlsys_accepts():
    model = MODELS["qwen2.5-7b"]
    ranked = search(H100_64, model, WORK, top=4)
    rates = [round(r.samples_per_s, 1) for r in ranked]  # ties: fresher samples first
    assert rates == sorted(rates, reverse=True) and rates[0] > 0
    for r in ranked:
        cfg = load_config(overrides(r, WORK, model))  # every cross-check of rlsys train
        assert cfg.rollout.num_workers == r.candidate.placement.rollout_workers
        assert cfg.learner.world_size == r.candidate.learner_gpus


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
    assert "--model 'gpt5'" in capsys.readouterr().err
