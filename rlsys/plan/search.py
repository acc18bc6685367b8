"""Placements for a GPU cluster, ranked by predicted samples/s (``rlsys plan --cluster``).

Enumerates colocated (every GPU holds an engine shard and a learner rank; the engines sleep
while the learners train; synchronous) and disaggregated placements (a rollout/learner split
of the GPUs, in eighths), engines' tensor-parallel sizes, ``max_staleness`` and partial
rollouts, keeps those whose memory fits (``hardware``), ranks them with a closed-form
estimate, simulates the best with the discrete-event simulator and prints them ranked, each
with the ``rlsys train`` overrides that run it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from rlsys.plan.costs import StageCosts, read_costs
from rlsys.plan.hardware import (
    GPU,
    Model,
    costs_for,
    engine_max_seqs,
    learner_fits,
    parse_gpu,
    parse_model,
)
from rlsys.plan.simulator import Prediction, simulate
from rlsys.plan.workload import Placement, ReplyLengths, Workload, WorkloadError

TP_SIZES = (1, 2, 4, 8)
STALENESS = (0, 1, 2, 4)
SPLITS = 8  # rollout share of the GPUs, in eighths


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu_name: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu(self) -> GPU:
        return parse_gpu(self.gpu_name)

    @classmethod
    def parse(cls, spec: str) -> Cluster:
        """``nodes=8,gpus_per_node=8,gpu=H100``."""
        try:
            keys = dict(part.split("=", 1) for part in spec.split(","))
            cluster = cls(int(keys["nodes"]), int(keys["gpus_per_node"]), keys["gpu"])
        except (ValueError, KeyError) as exc:
            raise WorkloadError(
                f"--cluster {spec!r}: give 'nodes=N,gpus_per_node=G,gpu=NAME'"
            ) from exc
        if cluster.nodes < 1 or cluster.gpus_per_node < 1:
            raise WorkloadError(f"--cluster {spec!r}: nodes and gpus_per_node must be >= 1")
        cluster.gpu  # noqa: B018 - names the known GPUs if this one is not
        return cluster


@dataclass(frozen=True)
class Candidate:
    """One placement with the costs of its engines and ranks."""

    placement: Placement
    rollout_gpus: int
    learner_gpus: int
    costs: StageCosts
    max_num_seqs: int  # what one engine decodes at once (KV cache)


@dataclass
class Ranked:
    candidate: Candidate
    prediction: Prediction

    @property
    def samples_per_s(self) -> float:
        return self.prediction.steady_samples_per_s


def candidates(
    cluster: Cluster, model: Model, work: Workload, calibrated: dict[str, float] | None = None
) -> list[Candidate]:
    """Every placement whose memory fits, with its costs (``calibrated`` replacing the
    published-figure constants it names)."""
    gpu, total = cluster.gpu, cluster.gpus
    context = work.prompt_tokens + work.lengths.mean
    out: list[Candidate] = []
    for tp in TP_SIZES:
        max_seqs = engine_max_seqs(gpu, model, tp, context)
        if tp > cluster.gpus_per_node or total % tp or max_seqs < work.n_samples:
            continue

        def costs(learners: int, colocated: bool, tp: int = tp) -> StageCosts:
            base = costs_for(
                gpu, model, tp, work.n_samples, context, learners, cluster.gpus_per_node,
                colocated,
            )  # fmt: skip
            return dataclasses.replace(base, **(calibrated or {}))

        if learner_fits(gpu, model, total) and work.batch_size * work.n_samples >= total:
            place = Placement(total // tp, total, 0, colocated=True, engine_tp=tp)
            out.append(Candidate(place, total, total, costs(total, True), max_seqs))
        splits = {round(total * k / SPLITS / tp) * tp for k in range(1, SPLITS)}
        for rollout in sorted(s for s in splits if 0 < s < total):
            learners = total - rollout
            if not learner_fits(gpu, model, learners):
                continue
            if work.batch_size * work.n_samples < learners:
                continue
            for staleness in STALENESS:
                for partial in (False, True) if staleness else (False,):
                    place = Placement(rollout // tp, learners, staleness, partial, engine_tp=tp)
                    out.append(
                        Candidate(place, rollout, learners, costs(learners, False), max_seqs)
                    )
    return out


def per_request(c: Candidate, work: Workload) -> int:
    """Prompts per request: a batch over the engines, at most a KV cache's worth."""
    spread = math.ceil(work.batch_size / c.placement.rollout_workers)
    return max(1, min(spread, c.max_num_seqs // work.n_samples))


def estimate(c: Candidate, work: Workload) -> float:
    """Closed-form steady-state samples/s (for pruning before simulating): synchronous steps
    are generation + scoring + learner + sync; asynchronous ones the slowest of the three."""
    k = per_request(c, work)
    place, costs, n = c.placement, c.costs, work.n_samples
    rounds = math.ceil(work.batch_size / (k * place.rollout_workers))
    longest = float(np.quantile(work.lengths.values, 1 - 1 / (k * n + 1)))
    gen = rounds * costs.generation_s(k, k * n, work.prompt_tokens, round(longest), 0)
    gen += rounds * costs.gen_token_s * k * n * work.lengths.mean
    samples = work.batch_size * n
    tokens = samples * (work.prompt_tokens + work.lengths.mean)
    learn = costs.step_overhead_s + costs.train_s(
        samples, tokens, place.learner_ranks, work.ppo_epochs, work.mini_batches
    )
    if work.needs_logprobs:
        learn += costs.logprobs_s(samples, tokens, place.learner_ranks)
    learn += costs.weight_sync_s(work.weight_bytes)
    score = work.batch_size * costs.score_group_s
    if place.colocated:
        learn += costs.engine_sleep_s + costs.engine_wake_s
    step = gen + learn if place.max_staleness == 0 else max(gen, learn, score)
    return samples / step


def search(
    cluster: Cluster,
    model: Model,
    work: Workload,
    top: int = 5,
    calibrated: dict[str, float] | None = None,
) -> list[Ranked]:
    """The ``top`` placements by simulated steady-state samples/s (of the ``2 x top`` best
    by the estimate, at least 8)."""
    work = dataclasses.replace(work, weight_bytes=model.weight_bytes)
    found = candidates(cluster, model, work, calibrated)
    if not found:
        raise WorkloadError(
            f"no placement of {model.params / 1e9:.1f}B params fits {cluster.gpus} x "
            f"{cluster.gpu_name}: the learner's state or an engine's weights exceed memory"
        )
    shortlist = sorted(found, key=lambda c: -estimate(c, work))[: max(2 * top, 8)]
    ranked = []
    for c in shortlist:
        steps = c.placement.max_staleness + 1 + 4  # warm-up, then steady steps
        place = dataclasses.replace(c.placement, prompts_per_request=per_request(c, work))
        sim_work = dataclasses.replace(work, total_steps=steps, max_groups=None)
        ranked.append(Ranked(c, simulate(c.costs, sim_work, place)))
    # equal throughput (e.g. learner-bound): prefer fresher samples, then no partial rollouts
    ranked.sort(
        key=lambda r: (
            -round(r.samples_per_s, 1),
            r.candidate.placement.max_staleness,
            r.candidate.placement.partial,
        )
    )
    return ranked[:top]


def overrides(r: Ranked, work: Workload, model: Model) -> list[str]:
    """``rlsys train`` (or ``rlsys submit``) overrides that run this placement."""
    c, place = r.candidate, r.candidate.placement
    k = per_request(c, work)
    out = [
        f"placement={'colocated' if place.colocated else 'disaggregated'}",
        "rollout.engine=vllm",
        f"rollout.num_workers={place.rollout_workers}",
        f"rollout.num_gpus_per_worker={place.engine_tp}",
        f"rollout.vllm.tensor_parallel_size={place.engine_tp}",
        f"rollout.vllm.max_num_seqs={min(c.max_num_seqs, k * work.n_samples)}",
        f"rollout.prompts_per_request={k}",
        f"learner.world_size={place.learner_ranks}",
        "learner.num_gpus_per_rank=1",
        f"buffer.max_staleness={place.max_staleness}",
        f"data.batch_size={work.batch_size}",
        f"rollout.n_samples={work.n_samples}",
    ]
    if place.partial:
        out.append("rollout.partial_rollouts=true")
    if place.max_staleness:
        out.append("algorithm.off_policy=tis")
    if model.hub_id:
        out.append(f"model.path={model.hub_id}")
    return out


def format_ranked(ranked: list[Ranked], cluster: Cluster, work: Workload, model: Model) -> str:
    lines = []
    for i, r in enumerate(ranked, 1):
        c, place, p = r.candidate, r.candidate.placement, r.prediction
        kind = "colocated" if place.colocated else "disaggregated"
        rollout = f"{place.rollout_workers} engines x TP{place.engine_tp}"
        mode = f"max_staleness={place.max_staleness}" + (" partial" if place.partial else "")
        lines.append(
            f"#{i} {kind}: rollout {c.rollout_gpus} GPUs ({rollout}), learner "
            f"{c.learner_gpus} GPUs, {mode}\n"
            f"   {r.samples_per_s:.1f} samples/s ({r.samples_per_s / cluster.gpus:.2f} per "
            f"GPU), step {p.step_s:.1f} s, rollout idle {p.rollout_idle_frac:.2f}, learner "
            f"idle {p.learner_idle_frac:.2f}, staleness mean {p.staleness_mean:.2f}\n"
            f"   rlsys train {' '.join(overrides(r, work, model))}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlsys plan",
        description="rank placements for a GPU cluster by predicted samples/s (published GPU "
        "figures unless --costs gives a calibration); also: rlsys plan calibrate | predict",
    )
    p.add_argument("--cluster", required=True, help="nodes=8,gpus_per_node=8,gpu=H100")
    p.add_argument("--model", required=True, help="qwen2.5-7b | ... | params=,layers=,...")
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


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    cluster, model = Cluster.parse(args.cluster), parse_model(args.model)
    work = Workload(
        batch_size=args.batch_size,
        n_samples=args.n_samples,
        lengths=ReplyLengths.parse(args.task_lengths),
        prompt_tokens=args.prompt_tokens,
        ppo_epochs=args.ppo_epochs,
        needs_logprobs=True,  # off-policy correction for staleness > 0 needs the pass
    )
    ranked = search(cluster, model, work, args.top, _calibrated(args.costs))
    source = f"calibration {args.costs}" if args.costs else "published figures (hardware.py)"
    print(
        f"{cluster.gpus} x {cluster.gpu_name}, {model.params / 1e9:.1f}B params, "
        f"{args.batch_size} prompts x {args.n_samples} replies (mean {work.lengths.mean:.0f} "
        f"tokens) per step; costs from {source}\n"
    )
    print(format_ranked(ranked, cluster, work, model))
    print(f"\n({time.perf_counter() - started:.1f} s)")
    return 0
