"""The RLHF example's summary (``scripts/rlhf_example.sh``): the figures of each stage, read
from the stages' own ``summary.json`` files, and the gains on the task metric.

    python -m rlsys.trainers.preference.summary OUT.json sft=PATH rm=PATH ppo=PATH dpo=PATH

writes OUT.json and prints ``summary: OUT.json``. The task metric is the task verifier's
held-out greedy accuracy (``task=reviews``: the fraction of replies the hidden labeller calls
positive); the reward model's figure is its held-out pairwise accuracy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STAGES = ("sft", "rm", "ppo", "dpo")


def _stage_figures(name: str, s: dict) -> dict:
    """The figures that matter of one stage's summary.json."""
    if name == "sft":
        return {"steps": s["steps"], "eval_accuracy": s["eval_accuracy"], "model": s["final_model"]}
    if name == "rm":
        return {
            "steps": s["steps"],
            "train_pairs": s["data"]["train_pairs"],
            "eval_pairs": s["data"]["eval_pairs"],
            "eval_pairwise_accuracy_before": s["eval_pairwise_accuracy_before"],
            "eval_pairwise_accuracy": s["eval_pairwise_accuracy"],
            "model": s["final_model"],
        }
    figures = {
        "steps": s["steps"],
        "eval_accuracy_before": s["eval_accuracy_before"],
        "eval_accuracy_after": s["eval_accuracy_after"],
        "eval_accuracy_gain": s["eval_accuracy_after"] - s["eval_accuracy_before"],
        "model": s["final_model"],
    }
    if name == "dpo":
        figures["eval_pairwise_accuracy_before"] = s["eval_pairwise_accuracy_before"]
        figures["eval_pairwise_accuracy"] = s["eval_pairwise_accuracy"]
    return figures


def merge(paths: dict[str, str]) -> dict:
    """The example's summary from each stage's summary.json (``paths``: stage -> path);
    raises naming a missing stage or file."""
    missing = [name for name in STAGES if name not in paths]
    if missing:
        raise ValueError(f"no summary.json given for stage(s) {missing}; pass STAGE=PATH")
    stages = {}
    for name in STAGES:
        path = Path(paths[name])
        if not path.is_file():
            raise FileNotFoundError(f"stage {name}: {path} does not exist (did the stage fail?)")
        stages[name] = {"summary": str(path), **_stage_figures(name, json.loads(path.read_text()))}
    return {
        "task_metric": "held-out greedy accuracy of the task's verifier",
        "sft_accuracy": stages["sft"]["eval_accuracy"],
        "rm_pairwise_accuracy": stages["rm"]["eval_pairwise_accuracy"],
        "ppo_accuracy": stages["ppo"]["eval_accuracy_after"],
        "ppo_gain": stages["ppo"]["eval_accuracy_gain"],
        "dpo_accuracy": stages["dpo"]["eval_accuracy_after"],
        "dpo_gain": stages["dpo"]["eval_accuracy_gain"],
        "stages": stages,
    }


def main(argv: list[str]) -> int:
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        print(
            "usage: python -m rlsys.trainers.preference.summary OUT.json "
            + " ".join(s + "=PATH" for s in STAGES),
            file=sys.stderr,
        )
        return 2
    out = Path(argv[0])
    summary = merge(dict(a.split("=", 1) for a in argv[1:]))
    out.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"rlhf example: SFT accuracy {summary['sft_accuracy']:.3f}; reward model pairwise "
        f"accuracy {summary['rm_pairwise_accuracy']:.3f}; PPO against it "
        f"{summary['stages']['ppo']['eval_accuracy_before']:.3f} -> {summary['ppo_accuracy']:.3f}; "
        f"DPO {summary['stages']['dpo']['eval_accuracy_before']:.3f} -> {summary['dpo_accuracy']:.3f}"
    )
    print(f"summary: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
