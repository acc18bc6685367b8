"""Seconds per stage of one RL step, on real Ray actors.

    python scripts/bench_step.py [--steps 10] [--warmup 2] [--json out.json] [key=value ...]

Runs the controller for warm-up + measured steps and prints, per stage (generation, scoring,
reference, learner logprobs, train, weight sync), the mean and spread of its seconds, and the
overhead: step time minus the sum of the stages (queues, Ray calls, batching, bookkeeping); run
it synchronous (the default ``buffer.max_staleness=0``) for the stages to add up. It also
prints the bytes a weight sync sends and the peak resident memory of the learner ranks and
rollout engines (read from /proc: local Ray only), the CPU, and the step's roofline
(docs/roofline.md): the learner's TFLOP/s and MFU against the matmul peak its ranks measured
in their compute dtype (and a GPU's published peak), the engines' share of the measured copy
bandwidth while decoding, the step's floor (its work at those peaks) and step / floor; then the
matmul peak measured again after the steps, with the engines stopped, and MFU and step / floor
at the higher of the two peaks (the start's can read low: see ``_at_the_higher_peak``). By default
it starts from the untrained built-in model with group filtering off, so every step trains
(stage costs do not depend on accuracy). ``--json PATH`` writes the figures as a list of records.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

STAGES = ["generation", "scoring", "reference", "learner_logprobs", "train", "weight_sync"]
DEFAULTS = ["warm_start.enabled=false", "algorithm.filter_uniform_groups=false"]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from rlsys.config.schema import TrackingConfig
    from rlsys.resolve import load_config
    from rlsys.run.bench import write_records

    cfg = load_config(DEFAULTS + args.overrides)
    cfg.eval.validation_prompts = 0  # it never evaluates, so keeps no best policy (a preset may)
    from rlsys.data.tasks import load_task
    from rlsys.launch.local import connect_ray
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.placement.resources import Roles
    from rlsys.run.tracking import Tracker
    from rlsys.runtime import quiet_libraries
    from rlsys.trainers.rl.controller import Controller
    from rlsys.trainers.rl.timing import setup_frozen
    from rlsys.workers.pools import start_pools

    quiet_libraries()
    roles = Roles.for_rl(cfg)
    connect_ray(cfg, roles)
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path)
    task = load_task(cfg.task, cfg.run.seed)
    pools = start_pools(cfg, path, roles)
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        tracker = Tracker(Path(tmp), TrackingConfig(console=False), "bench", {})
        again = None  # the learner ranks' matmul peak measured after the steps
        controller = Controller(cfg, pools, tokenizer, task, tracker)
        records = []
        with setup_frozen():  # as Controller.run trains
            controller.state.pipeline.start()
            try:
                for step in range(1, args.warmup + args.steps + 1):
                    metrics = controller.step(step)
                    if step > args.warmup:
                        records.append(metrics)
                memory = _peak_memory(pools)
                controller.state.pipeline.stop()  # the engines stop: nothing else computes
                if cfg.tracking.roofline:
                    dtype = cfg.learner.mixed_precision or cfg.model.dtype
                    again = pools.learner.machine_peak(dtype, again=True).matmul_tflops
            finally:
                controller.state.pipeline.stop()
                tracker.close()
                pools.shutdown()
    for record in records:  # what the stages do not explain: queues, Ray calls, batching
        record["overhead"] = record["perf/step_s"] - sum(
            record.get(f"time/{stage}", 0.0) for stage in STAGES
        )

    def column(key: str) -> list[float]:
        return [r.get(key, 0.0) for r in records]

    step_mean = statistics.mean(column("perf/step_s"))
    padding = statistics.mean(column("perf/padding_frac"))  # learner.packing lowers it
    rows = []
    for stage in STAGES + ["overhead", "step"]:
        key = {"overhead": "overhead", "step": "perf/step_s"}.get(stage, f"time/{stage}")
        values = column(key)
        mean = statistics.mean(values)
        rows.append(
            {
                "stage": stage,
                "seconds_mean": mean,
                "seconds_std": statistics.pstdev(values),
                "share_of_step": mean / step_mean,
                "steps": len(values),
                "learner_world_size": cfg.learner.world_size,
                "rollout_workers": cfg.rollout.num_workers,
                "samples_per_step": cfg.data.batch_size * cfg.rollout.n_samples,
                "cpus": os.cpu_count(),
                "weight_sync_bytes": statistics.mean(column("perf/weight_sync_bytes")),
                "padding_frac": padding,
                "packing": cfg.learner.packing,
                **memory,
            }
        )
    print(
        f"\nstep benchmark: {len(records)} steps after {args.warmup} warm-up, "
        f"{cfg.data.batch_size}x{cfg.rollout.n_samples} samples/step, "
        f"learner.world_size={cfg.learner.world_size}, "
        f"rollout.num_workers={cfg.rollout.num_workers}, {os.cpu_count()} CPUs"
    )
    print(f"{'stage':<18}{'mean s':>10}{'std s':>10}{'share':>9}")
    for row in rows:
        print(
            f"{row['stage']:<18}{row['seconds_mean']:>10.4f}{row['seconds_std']:>10.4f}"
            f"{row['share_of_step']:>8.1%}"
        )
    samples = cfg.data.batch_size * cfg.rollout.n_samples
    print(
        f"samples/s {samples / step_mean:.0f}, tokens/s "
        f"{statistics.mean(column('perf/tokens_per_s')):.0f}, padding_frac {padding:.3f} "
        f"(learner.packing={str(cfg.learner.packing).lower()})"
    )
    print(
        f"weight sync {rows[0]['weight_sync_bytes'] / 2**20:.2f} MiB a step; peak RSS: "
        f"learner rank {memory['learner_peak_rss_gib']:.2f} GiB, "
        f"engine {memory['engine_peak_rss_gib']:.2f} GiB (largest of each)"
    )
    roofline = _roofline(records)
    if again is not None:
        roofline.update(_at_the_higher_peak(roofline, again, step_mean))
    for row in rows:
        row.update(roofline)
    print(_roofline_lines(roofline, step_mean))
    write_records(args.json_path, rows)
    return 0


ROOFLINE = ["perf/learner_tflops", "perf/mfu", "perf/mfu_published", "perf/decode_bw_frac"]
FLOORS = ["learner", "reference", "generation", "weight_sync"]


def _roofline(records: list[dict]) -> dict:
    """The measured steps' mean roofline figures (``rlsys.trainers.rl.roofline``), the
    machine's peaks and the CPU."""
    from rlsys.perf.machine import cpu_info

    keys = ROOFLINE + [f"perf/floor_{s}_s" for s in FLOORS]
    keys += ["perf/floor_s", "perf/step_over_floor", "perf/peak_tflops", "perf/copy_gbps"]
    out: dict = {"cpu": cpu_info().line().removeprefix("CPU: ")}
    for key in keys:
        values = [r[key] for r in records if key in r]
        if values:
            out[key.removeprefix("perf/")] = statistics.mean(values)
    return out


def _at_the_higher_peak(fig: dict, again: float, step_mean: float) -> dict:
    """MFU and the floor at the higher of the peak measured at start and the one measured
    after the steps. The start's is taken while Ray's processes and the engines start, and
    on a shared host another tenant can be busy at either moment: a low reading makes the
    floor too high and step / floor too good. The FLOP-bound floors scale with the peak;
    scaling the generation floor too where it is bound by bandwidth makes the floor lower,
    so step / floor here errs high, never low."""
    out: dict = {"peak_tflops_after": again}
    if "peak_tflops" not in fig or "floor_s" not in fig:
        return out
    scale = fig["peak_tflops"] / max(fig["peak_tflops"], again)
    flops_bound = sum(fig.get(f"floor_{s}_s", 0.0) for s in ("learner", "reference", "generation"))
    floor = fig["floor_s"] - flops_bound * (1 - scale)
    out["floor_s_at_higher_peak"] = floor
    out["step_over_floor_at_higher_peak"] = step_mean / floor
    if "mfu" in fig:
        out["mfu_at_higher_peak"] = fig["mfu"] * scale
    return out


def _roofline_lines(fig: dict, step_mean: float) -> str:
    """The roofline block of the report (figures a run could not measure are left out)."""
    lines = [f"CPU: {fig['cpu']}"]
    if "learner_tflops" in fig:
        line = (
            f"learner {fig['learner_tflops']:.4f} TFLOP/s, MFU {fig['mfu']:.1%} of the "
            f"measured {fig['peak_tflops']:.3f} TFLOP/s peak"
        )
        if "mfu_published" in fig:
            line += f", {fig['mfu_published']:.1%} of the published peak"
        lines.append(line)
    if "decode_bw_frac" in fig:
        lines.append(
            f"decode reads weights at {fig['decode_bw_frac']:.2%} of the measured "
            f"{fig['copy_gbps']:.1f} GB/s copy bandwidth"
        )
    if "floor_s" in fig:
        parts = ", ".join(f"{s} {fig.get(f'floor_{s}_s', 0.0):.4f}" for s in FLOORS)
        lines.append(
            f"floor {fig['floor_s']:.4f} s ({parts}); step {step_mean:.4f} s = "
            f"{step_mean / fig['floor_s']:.2f}x the floor"
        )
    if "step_over_floor_at_higher_peak" in fig:
        mfu = fig.get("mfu_at_higher_peak")
        lines.append(
            f"matmul peak measured again after the steps: {fig['peak_tflops_after']:.3f} "
            f"TFLOP/s ({fig['peak_tflops_after'] / fig['peak_tflops']:.0%} of the start's); "
            f"at the higher of the two: {'' if mfu is None else f'MFU {mfu:.1%}, '}floor "
            f"{fig['floor_s_at_higher_peak']:.4f} s, step = "
            f"{fig['step_over_floor_at_higher_peak']:.2f}x the floor"
        )
    return "\n".join(lines)


def _peak_memory(pools) -> dict[str, float]:
    """Peak resident memory (GiB) of the largest learner rank and rollout engine."""
    import ray

    from rlsys.run.bench import peak_rss_bytes

    def largest(workers) -> float:
        peaks = [peak_rss_bytes(pid) or 0 for pid in ray.get([w.pid.remote() for w in workers])]
        return max(peaks) / 2**30

    return {
        "learner_peak_rss_gib": largest(pools.learner.workers),
        "engine_peak_rss_gib": largest(pools.rollout.workers),
    }


if __name__ == "__main__":
    sys.exit(main())
