"""Every algorithm preset on the tiny arithmetic task at one sample budget.

    python scripts/bench_algorithms.py [--algorithms ppo,grpo,...] [--steps 150]
        [--json out.json] [key=value ...]

Runs ``rlsys train algorithm=<name>`` once per preset (a fresh process and Ray each), all
from the same warm-started tiny model, with ``trainer.total_steps=--steps`` and
``trainer.max_samples`` = steps x data.batch_size x rollout.n_samples generated replies, so a
preset that draws extra samples (DAPO's dynamic sampling) or generates a greedy baseline
reply per prompt (ReMax) stops when it has generated the same number. Prints algorithm,
steps, trained samples, generated replies, wall seconds, held-out greedy accuracy before and
after, and the policy's token entropy at the end (the mean ``train/entropy`` of the last 10
steps: entropy collapse is what several presets exist to prevent); ``--json PATH`` writes
those records (keys ``algorithm``, ``steps``, ``samples``, ``replies``, ``wall_s``,
``eval_accuracy_before``, ``eval_accuracy_after``, ``entropy_end``, ...). Extra
``key=value`` overrides go to every run; without ``--algorithms``, presets the config refuses
with them are skipped with the reason (gigpo needs a multi-turn task: ``--algorithms
grpo,gigpo task=calculator_tool`` compares them on the calculator tool task).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from rlsys.run.bench import run_train, write_records


def presets() -> list[str]:
    """Every preset in conf/algorithm, PPO first."""
    from rlsys.config.loader import conf_dir

    names = sorted(p.stem for p in (conf_dir() / "algorithm").glob("*.yaml"))
    return sorted(names, key=lambda n: n != "ppo")


def refusal(name: str, overrides: list[str]) -> str | None:
    """Why the config refuses preset ``name`` with ``overrides``; None if it composes."""
    from rlsys.config.errors import ConfigError
    from rlsys.resolve import load_config

    try:
        load_config([f"algorithm={name}", *overrides])
    except ConfigError as exc:
        return str(exc)
    return None


def run_preset(name: str, steps: int, overrides: list[str], out_dir: Path) -> dict:
    """One ``rlsys train`` run; returns its summary plus the algorithm name."""
    from rlsys.resolve import load_config

    cfg = load_config([f"algorithm={name}", *overrides])
    budget = steps * cfg.data.batch_size * cfg.rollout.n_samples
    run = run_train(
        name,
        [
            f"algorithm={name}",
            f"trainer.total_steps={steps}",
            f"trainer.max_samples={budget}",
            "trainer.eval_every=0",
            *overrides,
        ],
        out_dir,
    )
    summary = run.summary
    entropies = [m["train/entropy"] for m in run.metrics if "train/entropy" in m][-10:]
    return {
        "algorithm": name,
        "steps": summary["steps"],
        "samples": summary["samples"],
        "replies": summary["accounting"]["samples_issued"] + summary.get("baseline_replies", 0),
        "entropy_end": sum(entropies) / len(entropies) if entropies else float("nan"),
        "wall_s": summary["wall_s"],
        "process_wall_s": run.process_wall_s,
        "eval_accuracy_before": summary["eval_accuracy_before"],
        "eval_accuracy_after": summary["eval_accuracy_after"],
        "eval_num_prompts": summary["eval_num_prompts"],
        "samples_dropped_filtered": summary["samples_dropped_filtered"],
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algorithms", help="comma-separated presets (default: all)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--out-dir", help="keep the run directories here (default: temporary)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    known = presets()
    names = [n.strip() for n in args.algorithms.split(",")] if args.algorithms else known
    unknown = sorted(set(names) - set(known))
    if unknown:
        parser.error(f"unknown algorithms {unknown}; pick from {known}")
    if not args.algorithms:
        refused = {name: refusal(name, args.overrides) for name in names}
        for name, reason in refused.items():
            if reason is not None:
                print(f"skipped {name}: {reason}")
        names = [name for name in names if refused[name] is None]

    records = []
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(args.out_dir or tmp)
        print(
            f"{'algorithm':<24}{'steps':>6}{'samples':>9}{'replies':>9}{'wall s':>9}"
            f"{'before':>8}{'after':>8}{'entropy':>9}"
        )
        for name in names:
            record = run_preset(name, args.steps, args.overrides, out_dir)
            records.append(record)
            print(
                f"{name:<24}{record['steps']:>6}{record['samples']:>9}{record['replies']:>9}"
                f"{record['wall_s']:>9.0f}{record['eval_accuracy_before']:>8.3f}"
                f"{record['eval_accuracy_after']:>8.3f}{record['entropy_end']:>9.3f}",
                flush=True,
            )
    write_records(args.json_path, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
