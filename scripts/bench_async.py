"""Synchronous vs one-step-off vs asynchronous training at one sample budget.

    python scripts/bench_async.py [--steps 60] [--staleness 0,1,2] [--json out.json]
        [--out-dir DIR] [key=value ...]

Runs ``rlsys train buffer.max_staleness=<s>`` once per bound (a fresh process and Ray each)
with the rollout worker and the learner on separate cores (``placement=disaggregated``, one
CPU each) and ``trainer.max_samples`` = steps x data.batch_size x rollout.n_samples, so every
mode generates the same samples, from the same cached warm start. The workload defaults to
``DEFAULTS`` below (vLLM, one learner pass per batch, truncated importance sampling). Prints trained samples per second of training wall time
(evaluation excluded), the speedup over synchronous (the first bound given, normally 0), each
pool's mean idle fraction, stale drops and held-out greedy accuracy after training.
``--json PATH`` writes the records (keys ``mode``, ``max_staleness``, ``samples_per_s``,
``speedup_vs_sync``, ``eval_accuracy_after``, ...). Extra ``key=value`` overrides go to every
run (for example ``rollout.partial_rollouts=true`` or ``algorithm.off_policy=tis``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from rlsys.run.bench import run_train, write_records

# Rollout and learner get one core each; both pools run the same work in every mode. No
# group filter: every generated sample is trained on unless it goes stale, so the modes
# differ only in what overlaps.
PLACEMENT = [
    "placement=disaggregated",
    "rollout.num_workers=1",
    "rollout.num_cpus_per_worker=1",
    "learner.world_size=1",
    "learner.num_cpus_per_rank=1",
    "algorithm.filter_uniform_groups=false",
]
# The workload, overridable: vLLM generation and one learner pass per batch keep the two pools
# about equally busy in synchronous mode (so overlap has something to gain), and truncated
# importance sampling corrects for the policy lag. docs/async.md has runs without these.
DEFAULTS = ["rollout.engine=vllm", "learner.ppo_epochs=1", "algorithm.off_policy=tis"]
MODES = {0: "sync", 1: "one_step_off"}


def mode_name(staleness: int) -> str:
    return MODES.get(staleness, "async")


def run_mode(staleness: int, steps: int, overrides: list[str], out_dir: Path) -> dict:
    """One ``rlsys train`` run at ``buffer.max_staleness=staleness``; returns its record."""
    from rlsys.resolve import load_config

    overrides = [*DEFAULTS, *overrides]
    cfg = load_config([*PLACEMENT, *overrides])
    budget = steps * cfg.data.batch_size * cfg.rollout.n_samples
    run = run_train(
        f"staleness{staleness}",
        [
            *PLACEMENT,
            f"buffer.max_staleness={staleness}",
            f"trainer.total_steps={steps}",
            f"trainer.max_samples={budget}",
            "trainer.eval_every=0",
            *overrides,
        ],
        out_dir,
    )
    summary = run.summary
    steps_metrics = [m for m in run.metrics if "pool/learner_idle_frac" in m and m["step"] > 0]

    def mean(key: str) -> float:
        values = [m[key] for m in steps_metrics if key in m]
        return float(np.mean(values)) if values else float("nan")

    accounting = summary["accounting"]
    return {
        "mode": mode_name(staleness),
        "max_staleness": staleness,
        "steps": summary["steps"],
        "samples_issued": accounting["samples_issued"],
        "samples_trained": accounting["samples_trained"],
        "samples_dropped": accounting["samples_dropped"],
        "accounting_balanced": accounting["balanced"],
        "train_wall_s": summary["train_wall_s"],
        "samples_per_s": summary["trained_samples_per_s"],
        "rollout_idle_frac": mean("pool/rollout_idle_frac"),
        "learner_idle_frac": mean("pool/learner_idle_frac"),
        "staleness_mean": mean("buffer/staleness_mean"),
        "samples_continued": summary["samples_continued"],
        "eval_accuracy_before": summary["eval_accuracy_before"],
        "eval_accuracy_after": summary["eval_accuracy_after"],
        "eval_num_prompts": summary["eval_num_prompts"],
        "process_wall_s": run.process_wall_s,
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--staleness", default="0,1,2", help="comma-separated bounds, sync first")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--out-dir", help="keep the run directories here (default: temporary)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    bounds = [int(s) for s in args.staleness.split(",")]

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(args.out_dir or tmp)
        print(
            f"{'mode':<14}{'stale':>6}{'samples/s':>11}{'speedup':>9}{'roll idle':>11}"
            f"{'learn idle':>12}{'dropped':>9}{'acc before':>12}{'acc after':>11}"
        )
        for staleness in bounds:
            record = run_mode(staleness, args.steps, args.overrides, out_dir)
            record["speedup_vs_sync"] = record["samples_per_s"] / (
                records[0]["samples_per_s"] if records else record["samples_per_s"]
            )
            records.append(record)
            print(
                f"{record['mode']:<14}{staleness:>6}{record['samples_per_s']:>11.1f}"
                f"{record['speedup_vs_sync']:>8.2f}x{record['rollout_idle_frac']:>11.2f}"
                f"{record['learner_idle_frac']:>12.2f}"
                f"{sum(record['samples_dropped'].values()):>9}"
                f"{record['eval_accuracy_before']:>12.3f}{record['eval_accuracy_after']:>11.3f}",
                flush=True,
            )
    write_records(args.json_path, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
