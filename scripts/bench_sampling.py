"""Prompt samplers, the replay store and rollout shapes at one generation budget: uniform
against the curriculum and against uniform with replay of rare successes, flat groups
against tree rollouts.

    python scripts/bench_sampling.py [--samplers uniform,level,prompt,replay] [--rollouts flat]
        [--seeds 0,1] [--steps 100] [--json out.json] [key=value ...]

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

Other tasks go in as overrides: ``task=arithmetic_mixed`` (mixed difficulty, where the
curriculum has uniform groups to cut) and ``task=arithmetic_scratchpad`` (long worked replies
decided late, where tree rollouts can share early segments); docs/sampling.md has the tables.

``--rollouts`` crosses each sampler with rollout shapes: ``flat`` (n independent replies per
prompt), ``tree`` (``rollout.tree.enabled=true algorithm.advantage=treepo``: the replies are
the leaves of a tree of shared segments, TreePO's sub-tree advantages), ``tree_grpo``
(the same trees, GRPO's flat advantages), ``tree_rl`` (the same trees, TreeRL's advantage
per segment) and ``tree_iid`` (``rollout.tree.mode=iid``: independent replies, as flat ones,
whose shared prefixes are generated once; GRPO's advantages); the fixed trees' knobs
(``rollout.tree.segment_tokens``, ``rollout.tree.branching``) go in as overrides.

Prints, per run: sampler, rollout shape, seed, steps trained, replies generated, the tokens
the engines generated per group (a tree's shared segments once), the fraction of scored
groups that were uniform (all rewards equal; the waste the curriculum exists to cut), samples
replayed, held-out greedy accuracy before and after, and that of the hardest level (the
arithmetic level with the lowest accuracy before training; ``eval.group_by=level``); then
the mean over seeds per arm. ``--json
PATH`` writes the per-run records. Extra ``key=value`` overrides go to every run.
"""

from __future__ import annotations

import argparse
import itertools
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
ROLLOUTS = {
    "flat": [],
    "tree": ["rollout.tree.enabled=true", "algorithm.advantage=treepo"],
    "tree_grpo": ["rollout.tree.enabled=true"],
    "tree_rl": ["rollout.tree.enabled=true", "algorithm.advantage=treerl"],
    "tree_iid": ["rollout.tree.enabled=true", "rollout.tree.mode=iid"],
}
DEFAULTS = ["task.train_size=2000", "trainer.eval_every=0", "eval.group_by=level"]


def uniform_fraction(metrics: list[dict]) -> float:
    """Uniform groups over all groups scored in the run (each step's fraction weighted by the
    samples it scored)."""
    rows = [m for m in metrics if "rollout/uniform_group_frac" in m and "rollout/samples" in m]
    total = sum(m["rollout/samples"] for m in rows)
    return sum(m["rollout/uniform_group_frac"] * m["rollout/samples"] for m in rows) / total


def tokens_per_group(metrics: list[dict], group_size: int) -> tuple[float, float]:
    """(tokens the engines generated, tokens the replies hold) per scored group over the run:
    the two differ by ``rollout/tokens_saved_frac`` (tree rollouts; flat: equal)."""
    rows = [m for m in metrics if "rollout/samples" in m]
    held = [m["rollout/samples"] * m["rollout/response_tokens"] for m in rows]
    made = [
        h * (1.0 - m.get("rollout/tokens_saved_frac", 0.0)) for h, m in zip(held, rows, strict=True)
    ]
    groups = sum(m["rollout/samples"] for m in rows) / group_size
    return sum(made) / groups, sum(held) / groups


def level_accuracies(metrics: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Held-out accuracy per arithmetic level at the first and the last evaluation."""
    evals = [m for m in metrics if "eval/accuracy" in m]
    prefix = "eval/accuracy_"

    def levels(m: dict) -> dict[str, float]:
        return {k[len(prefix) :]: v for k, v in m.items() if k.startswith(prefix)}

    return levels(evals[0]), levels(evals[-1])


def run_one(
    sampler: str, rollout: str, seed: int, steps: int, overrides: list[str], out: Path
) -> dict:
    from rlsys.resolve import load_config

    common = [*DEFAULTS, f"run.seed={seed}", *SAMPLERS[sampler], *ROLLOUTS[rollout], *overrides]
    cfg = load_config(common)
    budget = steps * cfg.data.batch_size * cfg.rollout.n_samples
    run = run_train(
        f"{sampler}-{rollout}-{seed}",
        [*common, f"trainer.total_steps={4 * steps}", f"trainer.max_samples={budget}"],
        out,
    )
    summary = run.summary
    generated, held = tokens_per_group(run.metrics, cfg.rollout.n_samples)
    before, after = level_accuracies(run.metrics)
    hardest = min(before, key=lambda level: (before[level], level))
    return {
        "sampler": sampler,
        "rollout": rollout,
        "seed": seed,
        "steps": summary["steps"],
        "replies": summary["accounting"]["samples_issued"],
        "generated_tokens_per_group": generated,
        "reply_tokens_per_group": held,
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
    parser.add_argument("--rollouts", default="flat", help=f"any of {list(ROLLOUTS)}")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=100, help="the budget, in steps' worth")
    parser.add_argument("--json", default=None, help="write the per-run records here")
    args, overrides = parser.parse_known_args(argv)
    samplers = args.samplers.split(",")
    unknown = [s for s in samplers if s not in SAMPLERS]
    if unknown:
        parser.error(f"--samplers: unknown {unknown}; choose from {list(SAMPLERS)}")
    rollouts = args.rollouts.split(",")
    unknown = [r for r in rollouts if r not in ROLLOUTS]
    if unknown:
        parser.error(f"--rollouts: unknown {unknown}; choose from {list(ROLLOUTS)}")
    arms = list(itertools.product(samplers, rollouts))
    seeds = [int(s) for s in args.seeds.split(",")]
    records = []
    print(
        f"{'sampler':8} {'rollout':9} {'seed':>4} {'steps':>5} {'replies':>7} "
        f"{'tok/group':>9} {'uniform':>7} {'replayed':>8} {'acc':>13} {'hardest level acc':>21}"
    )
    with tempfile.TemporaryDirectory(prefix="rlsys-bench-sampling-") as tmp:
        for seed in seeds:
            for sampler, rollout in arms:
                r = run_one(sampler, rollout, seed, args.steps, overrides, Path(tmp))
                records.append(r)
                print(
                    f"{sampler:8} {rollout:9} {seed:>4} {r['steps']:>5} {r['replies']:>7} "
                    f"{r['generated_tokens_per_group']:>9.2f} {r['uniform_group_frac']:>7.3f} "
                    f"{r['replayed']:>8} "
                    f"{r['eval_accuracy_before']:.3f} -> {r['eval_accuracy_after']:.3f} "
                    f"{r['hardest_level']:>4} {r['hardest_accuracy_before']:.3f} -> "
                    f"{r['hardest_accuracy_after']:.3f}",
                    flush=True,
                )
    print("mean over seeds:")
    for sampler, rollout in arms:
        rows = [r for r in records if (r["sampler"], r["rollout"]) == (sampler, rollout)]
        keys = ("steps", "uniform_group_frac", "generated_tokens_per_group")
        mean = {k: statistics.mean(r[k] for r in rows) for k in keys}
        after = [r["eval_accuracy_after"] for r in rows]
        hardest = [r["hardest_accuracy_after"] for r in rows]
        print(
            f"  {sampler:8} {rollout:9} steps {mean['steps']:.1f}, tokens per group "
            f"{mean['generated_tokens_per_group']:.2f}, uniform groups "
            f"{mean['uniform_group_frac']:.3f}, accuracy after {statistics.mean(after):.3f} "
            f"(range {min(after):.3f}-{max(after):.3f}), hardest level after "
            f"{statistics.mean(hardest):.3f} (range {min(hardest):.3f}-{max(hardest):.3f})"
        )
    write_records(args.json, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
