"""LoRA against full fine-tuning on the same RL batch, side by side in one run.

    python scripts/bench_lora.py [--steps 6] [--warmup 2] [--repeats 1] [--json out.json]
                                 [--kl 0.0] [key=value ...]

Runs ``scripts/bench_step.py`` (a fresh process and fresh Ray actors each time) on SmolLM2-135M
(the bf16 chat workload of docs/benchmarks.md, "SmolLM2": 4 prompts x 8 samples, one learner rank on both cores), once
as full fine-tuning (``model=smollm2-135m``) and once with adapters
(``model=smollm2-135m-lora``: rank 16 on every attention/MLP linear layer), alternating
``--repeats`` times. Prints per variant: seconds per step by stage, bytes and seconds of the
weight sync, peak resident memory of the learner rank and the engine; then LoRA's ratios.
``--kl 0.05`` adds a KL term: full fine-tuning then starts a reference worker, LoRA uses its
learner's base model. Extra ``key=value`` overrides go to both variants.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

WORKLOAD = [
    "task=arithmetic_chat",
    "learner.mixed_precision=bfloat16",
    "rollout.dtype=bfloat16",
    "rollout.temperature=0.7",
    "rollout.n_samples=8",
    "data.batch_size=4",
    "learner.world_size=1",
    "learner.num_cpus_per_rank=2",
    "learner.ppo_epochs=1",
    "learner.micro_batch_size=16",
]
VARIANTS = {"full": ["model=smollm2-135m"], "lora": ["model=smollm2-135m-lora"]}
STAGES = ["generation", "scoring", "reference", "learner_logprobs", "train", "weight_sync"]


def _run(name: str, overrides: list[str], steps: int, warmup: int, tmp: Path) -> list[dict]:
    out = tmp / f"{name}.json"
    command = [
        sys.executable,
        str(Path(__file__).with_name("bench_step.py")),
        f"--steps={steps}",
        f"--warmup={warmup}",
        f"--json={out}",
        *overrides,
    ]
    print(f"[{name}] {' '.join(overrides)}", flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"bench_step failed for {name}:\n{result.stderr[-4000:]}")
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--kl", type=float, default=0.0, help="algorithm.kl_coef for both")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from rlsys.run.bench import write_records

    runs: dict[str, list[dict[str, dict]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = list(VARIANTS) if repeat % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                overrides = [*WORKLOAD, *VARIANTS[name], f"algorithm.kl_coef={args.kl}"]
                rows = _run(name, [*overrides, *args.overrides], args.steps, args.warmup, Path(tmp))
                runs[name].append({row["stage"]: row for row in rows})

    def mean(name: str, stage: str, key: str = "seconds_mean") -> float:
        return statistics.mean(run[stage][key] for run in runs[name])

    records = []
    for name in VARIANTS:
        step = mean(name, "step")
        record = {
            "variant": name,
            "repeats": args.repeats,
            "steps": args.steps,
            "kl_coef": args.kl,
            "step_s": step,
            "step_s_per_run": [run["step"]["seconds_mean"] for run in runs[name]],
            "train_s_per_run": [run["train"]["seconds_mean"] for run in runs[name]],
            "samples_per_s": runs[name][0]["step"]["samples_per_step"] / step,
            "weight_sync_bytes": mean(name, "step", "weight_sync_bytes"),
            "learner_peak_rss_gib": mean(name, "step", "learner_peak_rss_gib"),
            "engine_peak_rss_gib": mean(name, "step", "engine_peak_rss_gib"),
            **{f"{stage}_s": mean(name, stage) for stage in [*STAGES, "overhead"]},
        }
        records.append(record)
    full, lora = records
    print(
        f"\nLoRA vs full fine-tuning, SmolLM2-135M, {args.steps} steps after {args.warmup} "
        f"warm-up, {args.repeats} run(s) each, algorithm.kl_coef={args.kl}"
    )
    print(f"{'':<26}{'full':>12}{'lora':>12}{'lora/full':>11}")
    rows = [(f"{stage} s", f"{stage}_s") for stage in [*STAGES, "overhead"]]
    rows += [
        ("step s", "step_s"),
        ("samples/s", "samples_per_s"),
        ("weight sync MiB", "weight_sync_bytes"),
        ("learner peak RSS GiB", "learner_peak_rss_gib"),
        ("engine peak RSS GiB", "engine_peak_rss_gib"),
    ]
    for label, key in rows:
        a, b = full[key], lora[key]
        if key == "weight_sync_bytes":
            a, b = a / 2**20, b / 2**20
        ratio = f"{b / a:>11.3f}" if a else f"{'-':>11}"
        print(f"{label:<26}{a:>12.4f}{b:>12.4f}{ratio}")
    for record in records:
        runs_s = ", ".join(f"{x:.2f}" for x in record["step_s_per_run"])
        print(f"{record['variant']}: step s per run {runs_s}")
    if lora["weight_sync_bytes"]:
        print(
            f"weight sync bytes: full / lora = {full['weight_sync_bytes'] / lora['weight_sync_bytes']:.1f}x"
        )
    write_records(args.json_path, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
