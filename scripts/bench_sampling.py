"""Prompt samplers and the replay store at one generation budget: uniform against the
curriculum, and against uniform with replay of rare successes.

    python scripts/bench_sampling.py [--samplers uniform,level,prompt,replay] [--seeds 0,1]
        [--steps 100] [--json out.json] [key=value ...]

Runs ``rlsys train`` (GRPO, the warm-started tiny model on the arithmetic task) once per
sampler and seed, in a fresh process each: ``uniform`` (every prompt once an epoch),
``level`` (``data.sampler=curriculum data.curriculum.bucket_key=level``: one pass-rate
estimate per arithmetic level, i.e. operator and carry count) and ``prompt`` (the curriculum
with an estimate per prompt); ``replay`` is ``uniform`` with ``buffer.replay.enabled=true``
(successes of prompts solved at most a quarter of the time put into their later all-wrong
groups; it needs ``algorithm.off_policy=tis`` or ``decoupled``, given to every run so that
the runs differ in the replay alone). Every run may generate ``--steps`` x data.batch_size x
rollout.n_samples replies (``trainer.max_samples``); groups whose rewards are all equal are
dropped and replaced (GRPO's filter), so a sampler that draws fewer of them trains more steps
on the same budget. ``task.train_size`` defaults to 2000 here so that prompts come back
several times within the budget (a per-prompt estimate needs that).

Prints, per run: sampler, seed, steps trained, replies generated, the fraction of scored
groups that were uniform (all rewards equal; the waste the curriculum exists to cut), samples
replayed, held-out greedy accuracy before and after, and that of the hardest level (the
arithmetic level with the lowest accuracy before training; ``eval.group_by=level``); then
the mean over seeds per sampler. ``--json
PATH`` writes the per-run records. Extra ``key=value`` overrides go to every run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rlsys.run.bench import run_train, write_records

SAMPLERS = {
    "uniform": ["data.sampler=uniform"],
    "level": ["data.sampler=curriculum", "data.curriculum.bucket_key=level"],
    "prompt": ["data.sampler=curriculum", "data.curriculum.bucket_key=null"],
    "replay": ["data.sampler=uniform", "buffer.replay.enabled=true"],
}
DEFAULTS = ["task.train_size=2000", "trainer.eval_every=0", "eval.group_by=level"]


def uniform_fraction(metrics: list[dict]) -> float:
    """Uniform groups over all groups scored in the run (each step's fraction weighted by the
    samples it scored)."""
    rows = [m for m in metrics if "rollout/uniform_group_frac" in m and "rollout/samples" in m]
    total = sum(m["rollout/samples"] for m in rows)
    return sum(m["rollout/uniform_group_frac"] * m["rollout/samples"] for m in rows) / total


def level_accuracies(metrics: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Held-out accuracy per arithmetic level at the first and the last evaluation."""
    evals = [m for m in metrics if "eval/accuracy" in m]
    prefix = "eval/accuracy_"

    def levels(m: dict) -> dict[str, float]:
        return {k[len(prefix) :]: v for k, v in m.items() if k.startswith(prefix)}

    return levels(evals[0]), levels(evals[-1])


def run_one(sampler: str, seed: int, steps: int, overrides: list[str], out: Path) -> dict:
    from rlsys.config.loader import load_config

    common = [*DEFAULTS, f"run.seed={seed}", *SAMPLERS[sampler], *overrides]
    cfg = load_config(common)
    budget = steps * cfg.data.batch_size * cfg.rollout.n_samples
    run = run_train(
        f"{sampler}-{seed}",
        [*common, f"trainer.total_steps={4 * steps}", f"trainer.max_samples={budget}"],
        out,
    )
    summary = run.summary
    before, after = level_accuracies(run.metrics)
    hardest = min(before, key=lambda level: (before[level], level))
    return {
        "sampler": sampler,
        "seed": seed,
        "steps": summary["steps"],
        "replies": summary["accounting"]["samples_issued"],
        "uniform_group_frac": uniform_fraction(run.metrics),
        "eval_accuracy_before": summary["eval_accuracy_before"],
        "eval_accuracy_after": summary["eval_accuracy_after"],
        "replayed": summary["accounting"]["samples_replayed"],
        "hardest_level": hardest,
        "hardest_accuracy_before": before[hardest],
        "hardest_accuracy_after": after[hardest],
        "level_accuracy_before": before,
        "level_accuracy_after": after,
        "wall_s": run.process_wall_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samplers", default=",".join(SAMPLERS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=100, help="the budget, in steps' worth")
    parser.add_argument("--json", default=None, help="write the per-run records here")
    args, overrides = parser.parse_known_args(argv)
    samplers = args.samplers.split(",")
    unknown = [s for s in samplers if s not in SAMPLERS]
    if unknown:
        parser.error(f"--samplers: unknown {unknown}; choose from {list(SAMPLERS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    records = []
    header = (
        f"{'sampler':8} {'seed':>4} {'steps':>5} {'replies':>7} {'uniform':>7} {'replayed':>8} "
        f"{'acc':>13} {'hardest level acc':>21}"
    )
    print(header)
    with tempfile.TemporaryDirectory(prefix="rlsys-bench-sampling-") as tmp:
        for seed in seeds:
            for sampler in samplers:
                r = run_one(sampler, seed, args.steps, overrides, Path(tmp))
                records.append(r)
                print(
                    f"{sampler:8} {seed:>4} {r['steps']:>5} {r['replies']:>7} "
                    f"{r['uniform_group_frac']:>7.3f} {r['replayed']:>8} "
                    f"{r['eval_accuracy_before']:.3f} -> {r['eval_accuracy_after']:.3f} "
                    f"{r['hardest_level']:>4} {r['hardest_accuracy_before']:.3f} -> "
                    f"{r['hardest_accuracy_after']:.3f}",
                    flush=True,
                )
    print("mean over seeds:")
    for sampler in samplers:
        rows = [r for r in records if r["sampler"] == sampler]
        mean = {k: statistics.mean(r[k] for r in rows) for k in ("steps", "uniform_group_frac")}
        after = [r["eval_accuracy_after"] for r in rows]
        hardest = [r["hardest_accuracy_after"] for r in rows]
        print(
            f"  {sampler:8} steps {mean['steps']:.1f}, uniform groups "
            f"{mean['uniform_group_frac']:.3f}, accuracy after {statistics.mean(after):.3f} "
            f"(range {min(after):.3f}-{max(after):.3f}), hardest level after "
            f"{statistics.mean(hardest):.3f} (range {min(hardest):.3f}-{max(hardest):.3f})"
        )
    write_records(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
