"""Peak memory and seconds per learner step of SmolLM2-135M, memory settings off and on.

    python scripts/bench_memory.py [--steps 2] [--warmup 1] [--rows 8] [--prompt 32]
                                   [--response 32] [--world-size 1] [--settings off,ckpt,...]
                                   [--json] [key=value ...]

Each setting runs in a fresh process (so its peak resident memory is its own): the learner
backend ``learner.backend`` names, built from the real config (``model=smollm2-135m``,
``learner.world_size`` ranks in a gloo group, ``learner.micro_batch_size`` = ``--rows``, one
micro-batch a step), takes ``--warmup`` + ``--steps`` GRPO-style policy steps (PPO clip, one
optimizer step per batch, old log-probabilities from the training pass) on a fixed batch of
``--rows`` random prompts and responses. Per setting it reports the mean and spread of the
measured steps' seconds and the peak RSS of the process (the largest rank's with
``--world-size 2``): VmHWM, which is ``ru_maxrss``, so model loading, the fp32 weights,
gradients, AdamW state and the step's activations all count; the RSS right after the backend
is built is reported too. ``--json`` prints one JSON object instead of the table. Extra
``key=value`` overrides go to every setting (e.g. ``learner.compile=true``). Figures measured
with it are in docs/learners.md (Memory); on a CPU without bf16 instructions the bf16 settings
take minutes a step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = {
    "off": [],
    "ckpt": ["learner.activation_checkpointing=true"],
    "bf16": ["learner.mixed_precision=bfloat16"],
    "bf16+ckpt": ["learner.mixed_precision=bfloat16", "learner.activation_checkpointing=true"],
}
GIB = 2**30


def _batch(tokenizer, rows: int, prompt: int, response: int, seed: int = 0):
    """``rows`` random prompts and responses of fixed lengths, random advantages."""
    import numpy as np

    from rlsys.data.collate import pack

    rng = np.random.default_rng(seed)
    vocab = len(tokenizer)
    prompts = rng.integers(0, vocab, (rows, prompt)).tolist()
    responses = rng.integers(0, vocab, (rows, response)).tolist()
    batch = pack(prompts, responses, tokenizer.pad_token_id)
    advantages = rng.standard_normal(rows).astype(np.float32)[:, None]
    batch.advantages = advantages * batch.loss_mask
    return batch


def _rank(rank: int, world_size: int, port: int, args, overrides: list[str], out: str) -> None:
    """One learner rank: build the backend, train, write its figures to ``out``.rank<r>."""
    import torch
    import torch.distributed as dist

    from rlsys.algorithms.objectives import PolicyObjective
    from rlsys.backends import build_backend
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.resolve import load_config
    from rlsys.run.bench import peak_rss_bytes
    from rlsys.runtime import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    cfg = load_config(["model=smollm2-135m", *overrides])
    path = resolve_model_path(cfg.model)
    backend = build_backend(cfg.learner, path, cfg.model.dtype, 1.0, torch.device("cpu"))
    built_rss = peak_rss_bytes(os.getpid()) or 0
    batch = _batch(load_tokenizer(path), args.rows, args.prompt, args.response)
    seconds = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        metrics = backend.train_step(batch, PolicyObjective(), 1, 1, seed=step)
        if step >= args.warmup:
            seconds.append(time.perf_counter() - start)
    record = {
        "step_s": statistics.mean(seconds),
        "step_s_std": statistics.pstdev(seconds),
        "steps_s": seconds,
        "peak_rss_gib": (peak_rss_bytes(os.getpid()) or 0) / GIB,
        "built_rss_gib": built_rss / GIB,
        "grad_norm": metrics["grad_norm"],
    }
    with open(f"{out}.rank{rank}", "w") as fh:
        json.dump(record, fh)
    dist.destroy_process_group()


def _child(args, overrides: list[str]) -> int:
    """Run the ranks of one setting in this process (and spawned ones) and print the largest
    rank's figures as one JSON line."""
    import tempfile

    import torch.multiprocessing as mp

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "distributed"))
    from backend_harness import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        port, ws = free_port(), args.world_size
        if ws == 1:
            _rank(0, 1, port, args, overrides, out)
        else:
            mp.spawn(_rank, args=(ws, port, args, overrides, out), nprocs=ws, join=True)
        ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(ws)]
    record = max(ranks, key=lambda r: r["peak_rss_gib"])
    record["step_s"] = max(r["step_s"] for r in ranks)
    print(json.dumps(record))
    return 0


def _run_setting(name: str, args, extra: list[str]) -> dict:
    overrides = [f"learner.world_size={args.world_size}", f"learner.micro_batch_size={args.rows}"]
    overrides.append("learner.max_tokens_per_micro_batch=null")  # one micro-batch, any length
    overrides += SETTINGS[name] + extra
    command = [
        sys.executable,
        __file__,
        "--child",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--rows={args.rows}",
        f"--prompt={args.prompt}",
        f"--response={args.response}",
        f"--world-size={args.world_size}",
        *overrides,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"setting {name} failed:\n{result.stderr[-4000:]}")
    record = json.loads(result.stdout.strip().splitlines()[-1])
    return {"setting": name, "overrides": overrides, **record}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rows", type=int, default=8, help="sequences per step (one micro-batch)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per sequence")
    parser.add_argument("--response", type=int, default=32, help="response tokens per sequence")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.child:
        return _child(args, args.overrides)
    names = args.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        parser.error(f"--settings: unknown {unknown}; pick from {list(SETTINGS)}")
    records = []
    for name in names:
        print(f"[{name}] running", file=sys.stderr, flush=True)
        records.append(_run_setting(name, args, args.overrides))
        print(f"[{name}] {json.dumps(records[-1])}", file=sys.stderr, flush=True)
    load = os.getloadavg()[0]
    summary = {
        "model": "smollm2-135m",
        "rows": args.rows,
        "tokens_per_row": args.prompt + args.response,
        "world_size": args.world_size,
        "steps": args.steps,
        "warmup": args.warmup,
        "cpus": os.cpu_count(),
        "load_avg_1min_after": load,
        "settings": records,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"SmolLM2-135M learner step, {args.rows} x {args.prompt}+{args.response} tokens, "
        f"world_size {args.world_size}, {args.steps} steps after {args.warmup} warm-up, "
        f"{os.cpu_count()} CPUs (1-min load after: {load:.1f})"
    )
    print("| setting | s/step | peak RSS GiB | RSS after build GiB | grad norm |")
    print("|---|---|---|---|---|")
    for r in records:
        print(
            f"| {r['setting']} | {r['step_s']:.2f} +- {r['step_s_std']:.2f} | "
            f"{r['peak_rss_gib']:.2f} | {r['built_rss_gib']:.2f} | {r['grad_norm']:.4f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
