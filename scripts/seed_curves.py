"""Held-out accuracy against wall time for several runs of one command (seeds): a markdown
table, and with ``--png`` a figure. Reads each run's metrics.jsonl and summary.json only.

    python scripts/seed_curves.py RUN_DIR [RUN_DIR ...] [--png curves.png] [--target 0.8]

Times are minutes from the start of training (the step-0 evaluation's start), as the
console's ``elapsed``; the command's own start-up (Ray, loading) comes before it. With
``eval.validation_prompts`` the policy the run kept (``checkpoints/best``) is marked.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlsys.run.report import load_metrics  # noqa: E402


def curve(run: Path) -> tuple[list[tuple[int, float, float, float | None]], dict]:
    """``[(step, minutes, held-out accuracy, validation accuracy or None)]`` and the
    summary of the run at ``run``."""
    steps = load_metrics(run / "metrics.jsonl")  # checked, rewinds dropped; no "time"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    stamps = {r["step"]: r["time"] for r in map(json.loads, filter(str.strip, lines))}
    first = min(steps)
    origin = stamps[first] - steps[first].get("time/eval", 0.0)
    points = [
        (step, (stamps[step] - origin) / 60, m["eval/accuracy"], m.get("eval/validation_accuracy"))
        for step, m in sorted(steps.items())
        if "eval/accuracy" in m
    ]
    return points, json.loads((run / "summary.json").read_text())


def label(run: Path) -> str:
    """``seed S`` from the run's config.yaml (the runs compared are seeds), else its name."""
    import yaml

    config = (
        yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    )
    seed = (config or {}).get("run", {}).get("seed")
    return f"seed {seed}" if seed is not None else run.name


def table(runs: list[Path], target: float) -> str:
    """One markdown row per run: its evaluations, when it first reached ``target``, the
    kept policy's step and figures, the last evaluation, and its steps."""
    rows = [
        "| run | accuracy (step @ minute) | first >= target | kept (step: validation, "
        "held-out) | at the end | steps |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        points, summary = curve(run)
        evals = ", ".join(f"{acc:.3f} ({step} @ {mins:.1f})" for step, mins, acc, _ in points)
        reached = next(
            (f"{step} @ {mins:.1f}" for step, mins, acc, _ in points if acc >= target), "never"
        )
        kept = summary.get("selected")
        chosen = (
            f"{kept['step']}: {kept['validation_accuracy']:.3f}, **{kept['accuracy']:.3f}**"
            if kept
            else "-"
        )
        rows.append(
            f"| {label(run)} | {evals} | {reached} | {chosen} | {points[-1][2]:.3f} | {summary['steps']} |"
        )
    return "\n".join(rows)


def figure(runs: list[Path], target: float, path: Path) -> None:
    """Held-out accuracy (solid) and validation accuracy (dashed) against minutes, the
    kept policy circled, ``target`` as a grey line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    for i, run in enumerate(runs):
        points, summary = curve(run)
        mins = [p[1] for p in points]
        ax.plot(
            mins, [p[2] for p in points], "-o", ms=3, color=f"C{i}", label=f"{label(run)} held-out"
        )
        if any(p[3] is not None for p in points):
            ax.plot(
                mins,
                [p[3] for p in points],
                "--",
                color=f"C{i}",
                alpha=0.6,
                label=f"{label(run)} validation",
            )
        kept = summary.get("selected")
        at = next((p for p in points if kept and p[0] == kept["step"]), None)
        if at:  # (a kept step rewound out of the records is not drawn)
            ax.plot([at[1]], [at[2]], "o", ms=10, mfc="none", color=f"C{i}")
    ax.axhline(target, color="grey", lw=0.8)
    ax.set(xlabel="minutes of training", ylabel="greedy accuracy", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories")
    parser.add_argument("--png", type=Path, help="also write the curves to this PNG")
    parser.add_argument("--target", type=float, default=0.8, help="accuracy line (0.8)")
    args = parser.parse_args()
    for run in args.runs:
        if not (run / "metrics.jsonl").is_file() or not (run / "summary.json").is_file():
            parser.error(f"{run} is not a finished run directory (metrics.jsonl, summary.json)")
    print(table(args.runs, args.target))
    if args.png:
        figure(args.runs, args.target, args.png)
        print(f"figure: {args.png}")


if __name__ == "__main__":
    main()
