"""Placements for a GPU cluster, ranked by predicted samples/s (``rlsys plan --cluster``).

Enumerates colocated (every GPU holds an engine shard and a learner rank; the engines sleep
while the learners train; synchronous) and disaggregated layouts (a rollout/learner split of
the GPUs, in eighths), engines' tensor-parallel sizes (whole attention and KV heads per
shard, within a node), ``max_staleness`` and partial rollouts; sizes each one's memory
(``memory``: micro-batch token budget, activation checkpointing, the engines' share and KV
cache) and drops those that do not fit; prices it (``pricing``); ranks them with a
closed-form estimate, simulates the best with the discrete-event simulator and prints them
ranked, each with the ``rlsys train`` overrides that run it (``Layout.overrides``: the same
description that was priced).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from rlsys.plan.costs import StageCosts, read_costs
from rlsys.plan.hardware import Cluster, Model, parse_model
from rlsys.plan.layout import MIXED_BF16, Layout, Precision, row_tokens, weight_transport
from rlsys.plan.memory import engine_max_seqs, engine_memory_frac, fit_micro_batch
from rlsys.plan.pricing import stage_costs
from rlsys.plan.simulator import Prediction, simulate
from rlsys.plan.workload import ReplyLengths, Workload, WorkloadError

TP_SIZES = (1, 2, 4, 8)
STALENESS = (0, 1, 2, 4)
SPLITS = 8  # rollout share of the GPUs, in eighths


@dataclass(frozen=True)
class Candidate:
    """A layout with its price."""

    layout: Layout
    costs: StageCosts


@dataclass
class Ranked:
    candidate: Candidate
    prediction: Prediction

    @property
    def samples_per_s(self) -> float:
        return self.prediction.steady_samples_per_s


def tp_sizes(cluster: Cluster, model: Model) -> list[int]:
    """Tensor-parallel sizes whose shards hold whole attention and KV heads and whose groups
    tile a node."""
    return [
        tp
        for tp in TP_SIZES
        if model.splits_over(tp) and tp <= cluster.gpus_per_node and cluster.gpus_per_node % tp == 0
    ]


def layouts(
    cluster: Cluster, model: Model, work: Workload, precision: Precision = MIXED_BF16
) -> list[Layout]:
    """Every layout whose memory fits."""
    gpu, total, n = cluster.gpu, cluster.gpus, work.n_samples
    row, context = row_tokens(work), work.prompt_tokens + work.lengths.mean
    out: list[Layout] = []
    for tp in tp_sizes(cluster, model):
        splits = {round(total * k / SPLITS / tp) * tp for k in range(1, SPLITS)}
        pools = [(total, total, True)] + [(r, total - r, False) for r in sorted(splits)]
        for rollout, learners, colocated in pools:
            if not 0 < rollout <= total or learners < 1 or work.batch_size * n < learners:
                continue
            micro = fit_micro_batch(gpu, model, precision, learners, row)
            frac = engine_memory_frac(gpu, model, precision, learners, colocated)
            kv_seqs = engine_max_seqs(gpu, model, precision, tp, frac, context) if frac > 0 else 0
            if micro is None or kv_seqs < n:
                continue
            engines = rollout // tp
            k = max(1, min(math.ceil(work.batch_size / engines), kv_seqs // n))
            base = Layout(
                model=model,
                colocated=colocated,
                engines=engines,
                engine_tp=tp,
                learner_ranks=learners,
                max_staleness=0,
                partial=False,
                transport=weight_transport(colocated, rollout),
                precision=precision,
                activation_checkpointing=micro.checkpointing,
                micro_batch_tokens=micro.tokens,
                micro_batch_rows=micro.rows,
                engine_memory_frac=frac,
                max_num_seqs=min(kv_seqs, k * n),
                prompts_per_request=k,
            )
            modes = [(0, False)] if colocated else [
                (s, partial) for s in STALENESS for partial in ((False, True) if s else (False,))
            ]  # fmt: skip
            out += [dataclasses.replace(base, max_staleness=s, partial=p) for s, p in modes]
    return out


def candidates(
    cluster: Cluster, model: Model, work: Workload, calibrated: dict[str, float] | None = None
) -> list[Candidate]:
    """Every layout whose memory fits, with its costs (``calibrated`` replacing the
    published-figure constants it names)."""
    return [
        Candidate(
            layout, dataclasses.replace(stage_costs(layout, cluster, work), **(calibrated or {}))
        )
        for layout in layouts(cluster, model, work)
    ]


def _work_of(layout: Layout, work: Workload) -> Workload:
    """The workload as ``layout`` runs it: its weight-update bytes and log-probability pass."""
    return dataclasses.replace(
        work, weight_bytes=layout.sync_bytes, needs_logprobs=layout.needs_logprobs(work)
    )


def estimate(c: Candidate, work: Workload) -> float:
    """Closed-form steady-state samples/s (for pruning before simulating): synchronous steps
    are generation + scoring + learner + sync; asynchronous ones the slowest of the three."""
    lay, costs, n = c.layout, c.costs, work.n_samples
    k = lay.prompts_per_request
    rounds = math.ceil(work.batch_size / (k * lay.engines))
    longest = float(np.quantile(work.lengths.values, 1 - 1 / (k * n + 1)))
    gen = rounds * costs.generation_s(k, k * n, work.prompt_tokens, round(longest), 0)
    gen += rounds * costs.gen_token_s * k * n * work.lengths.mean
    samples = work.batch_size * n
    tokens = samples * (work.prompt_tokens + work.lengths.mean)
    learn = costs.step_overhead_s + costs.train_s(
        samples, tokens, lay.learner_ranks, work.ppo_epochs, work.mini_batches
    )
    if work.needs_logprobs:
        learn += costs.logprobs_s(samples, tokens, lay.learner_ranks)
    learn += costs.weight_sync_s(work.weight_bytes)
    score = work.batch_size * costs.score_group_s
    if lay.colocated:
        learn += costs.engine_sleep_s + costs.engine_wake_s
    step = gen + learn if lay.max_staleness == 0 else max(gen, learn, score)
    return samples / step


def search(
    cluster: Cluster,
    model: Model,
    work: Workload,
    top: int = 5,
    calibrated: dict[str, float] | None = None,
) -> list[Ranked]:
    """The ``top`` layouts by simulated steady-state samples/s (of the ``2 x top`` best by
    the estimate, at least 8)."""
    found = candidates(cluster, model, work, calibrated)
    if not found:
        raise WorkloadError(
            f"no placement of {model.params / 1e9:.1f}B params fits {cluster.gpus} x "
            f"{cluster.gpu_name}: the learner's state and one row of "
            f"{row_tokens(work)} tokens, or an engine's weights and one group's KV cache, "
            "exceed memory"
        )
    shortlist = sorted(found, key=lambda c: -estimate(c, _work_of(c.layout, work)))
    ranked = []
    for c in shortlist[: max(2 * top, 8)]:
        steps = c.layout.max_staleness + 1 + 4  # warm-up, then steady steps
        sim_work = dataclasses.replace(_work_of(c.layout, work), total_steps=steps, max_groups=None)
        ranked.append(Ranked(c, simulate(c.costs, sim_work, c.layout.placement())))
    # equal throughput (e.g. learner-bound): prefer fresher samples, then no partial rollouts
    ranked.sort(
        key=lambda r: (
            -round(r.samples_per_s, 1),
            r.candidate.layout.max_staleness,
            r.candidate.layout.partial,
        )
    )
    return ranked[:top]


def format_ranked(ranked: list[Ranked], cluster: Cluster, work: Workload) -> str:
    lines = []
    for i, r in enumerate(ranked, 1):
        lay, p = r.candidate.layout, r.prediction
        kind = "colocated" if lay.colocated else "disaggregated"
        rollout = f"{lay.engines} engines x TP{lay.engine_tp}"
        mode = f"max_staleness={lay.max_staleness}" + (" partial" if lay.partial else "")
        recompute = ", activation checkpointing" if lay.activation_checkpointing else ""
        lines.append(
            f"#{i} {kind}: rollout {lay.rollout_gpus} GPUs ({rollout}), learner "
            f"{lay.learner_ranks} GPUs, {mode}; sync {lay.transport}; "
            f"{lay.precision.label}; {lay.micro_batch_tokens} tokens per micro-batch{recompute}\n"
            f"   {r.samples_per_s:.1f} samples/s ({r.samples_per_s / cluster.gpus:.2f} per "
            f"GPU), step {p.step_s:.1f} s, rollout idle {p.rollout_idle_frac:.2f}, learner "
            f"idle {p.learner_idle_frac:.2f}, staleness mean {p.staleness_mean:.2f}\n"
            f"   rlsys train {' '.join(lay.overrides(work))}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlsys plan",
        description="rank placements for a GPU cluster by predicted samples/s (published GPU "
        "figures unless --costs gives a calibration); also: rlsys plan calibrate | predict",
    )
    p.add_argument("--cluster", required=True, help="nodes=8,gpus_per_node=8,gpu=H100")
    p.add_argument(
        "--model", required=True, help="qwen2.5-0.5b | qwen2.5-7b | ... | "
        "params=,layers=,hidden=,heads=,kv_heads=,intermediate=,vocab="
    )  # fmt: skip
    p.add_argument(
        "--task-lengths", default="mean=600,max=4096", help="reply lengths: N | N1,N2 | "
        "mean=M,max=X[,sigma=S] (default mean=600,max=4096)"
    )  # fmt: skip
    p.add_argument("--prompt-tokens", type=float, default=256.0)
    p.add_argument("--batch-size", type=int, default=256, help="prompts per step")
    p.add_argument("--n-samples", type=int, default=8, help="replies per prompt")
    p.add_argument("--ppo-epochs", type=int, default=1)
    p.add_argument("--top", type=int, default=5)
    p.add_argument(
        "--costs", help="a calibration (rlsys plan calibrate) on this model and GPU: its "
        "identified constants replace the published-figure ones"
    )  # fmt: skip
    return p


def _calibrated(path: str | None) -> dict[str, float] | None:
    if not path:
        return None
    costs, data = read_costs(path)
    keys = {k for ks in data.get("identified", {}).values() for k in ks}
    keys |= {"step_overhead_s", "between_steps_s"}
    return {k: v for k, v in costs.to_dict().items() if k in keys}


@dataclass
class _Plan:
    args: argparse.Namespace
    cluster: Cluster
    model: Model
    work: Workload
    ranked: list[Ranked]


def _plan(argv: list[str]) -> _Plan:
    args = _parser().parse_args(argv)
    cluster, model = Cluster.parse(args.cluster), parse_model(args.model)
    work = Workload(
        batch_size=args.batch_size,
        n_samples=args.n_samples,
        lengths=ReplyLengths.parse(args.task_lengths),
        prompt_tokens=args.prompt_tokens,
        ppo_epochs=args.ppo_epochs,
    )
    ranked = search(cluster, model, work, args.top, _calibrated(args.costs))
    return _Plan(args, cluster, model, work, ranked)


def commands(
    cluster: Cluster,
    model: Model,
    work: Workload,
    top: int = 5,
    calibrated: dict[str, float] | None = None,
) -> list[list[str]]:
    """The override lists the search prints for ``work`` on ``cluster``, best first."""
    return [
        r.candidate.layout.overrides(work) for r in search(cluster, model, work, top, calibrated)
    ]


def plan_commands(argv: list[str]) -> list[list[str]]:
    """The override lists ``rlsys plan`` prints for these arguments (``argv`` as after
    ``rlsys plan``, e.g. ``["--cluster", "nodes=2,gpus_per_node=4,gpu=H100", "--model",
    "qwen2.5-0.5b"]``), best first; raises ``WorkloadError`` on bad input."""
    plan = _plan(argv)
    return [r.candidate.layout.overrides(plan.work) for r in plan.ranked]


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    plan = _plan(argv)
    args, cluster, model, work = plan.args, plan.cluster, plan.model, plan.work
    source = f"calibration {args.costs}" if args.costs else "published figures (hardware.py)"
    print(
        f"{cluster.gpus} x {cluster.gpu_name}, {model.params / 1e9:.1f}B params, "
        f"{args.batch_size} prompts x {args.n_samples} replies (mean {work.lengths.mean:.0f} "
        f"tokens) per step; costs from {source}\n"
    )
    print(format_ranked(plan.ranked, cluster, work))
    print(f"\n({time.perf_counter() - started:.1f} s)")
    return 0
