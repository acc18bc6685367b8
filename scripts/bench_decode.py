"""The HF engine's decode loop, eager against compiled (``rollout.engine_args.compile``).

    python scripts/bench_decode.py [--model smollm2-135m] [--task arithmetic_chat]
        [--dtype bfloat16] [--workloads 2x8x128,4x8x16] [--repeats 3] [--json out.json]

A workload ``PxSxT`` is P prompts (the task's first training prompts, rendered as rlsys sends
them) x S samples x T new tokens, sampled at temperature 1 in one ``generate`` call. Every row
decodes its whole budget (the engine's end tokens are cleared), so both loops take the same
decode steps whatever they sample. Two engines hold the same weights in ``--dtype``: eager
(today's loop) and compiled (a static KV cache and ``torch.compile`` of the forward step). The
compiled engine's first two calls of each workload are timed apart as its compile cost
(``compile_s``): the second call with a static cache of the final size can still recompile.
Then ``--repeats`` rounds alternate the two engines (the order flips each round, so drift on
a shared machine falls on both); per workload it prints each loop's median seconds and
generated tokens/s, the speed-up per round and its median, and ``decode_bw_frac``: the
weight bytes one decode step reads x the decode steps, over the seconds, over this machine's
memory-copy bandwidth measured in the same run (docs/roofline.md). The load average before
each round is recorded: on 2 cores a load above ~2 means something else shared them.
The CPU line (model, AMX) comes first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _workload(text: str) -> tuple[int, int, int]:
    try:
        prompts, samples, tokens = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise SystemExit(
            f"--workloads: {text!r} is not PxSxT (prompts x samples x tokens)"
        ) from None
    if min(prompts, samples, tokens) < 1:
        raise SystemExit(f"--workloads: {text!r} needs every count >= 1")
    return prompts, samples, tokens


def _prompt_ids(model: str, task: str, count: int) -> tuple[str, list[list[int]]]:
    """The model directory and the task's first ``count`` training prompts as token ids."""
    from rlsys.data.tasks import load_task
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.resolve import load_config
    from rlsys.trainers.collector import RolloutCollector

    cfg = load_config([f"model={model}", f"task={task}"])
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path)
    render = RolloutCollector.for_task(None, tokenizer, cfg.task, cfg.reward).prompt_format
    prompts = load_task(cfg.task, cfg.run.seed).train[:count]
    texts = [render.render(p.text, tokenizer) for p in prompts]
    return path, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a conf/model preset")
    parser.add_argument("--task", default="arithmetic_chat", help="a conf/task preset")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--workloads", default="2x8x128,4x8x16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write one record per workload here")
    args = parser.parse_args()
    workloads = [_workload(w) for w in args.workloads.split(",") if w]
    if not workloads or args.repeats < 1:
        parser.error("give at least one workload and --repeats >= 1")

    import torch

    from rlsys.config.schema import RolloutConfig
    from rlsys.engines.hf import HFEngine
    from rlsys.engines.settings import HFSettings
    from rlsys.perf.flops import ModelShape, decode_weight_bytes
    from rlsys.perf.machine import copy_gbps, cpu_info
    from rlsys.types import SamplingParams

    print(cpu_info().line(), flush=True)
    torch.set_num_threads(cpu_info().cores)
    path, ids = _prompt_ids(args.model, args.task, max(p for p, _, _ in workloads))
    cfg = RolloutConfig()
    engines = {
        "eager": HFEngine(path, args.dtype, cfg, "cpu"),
        "compiled": HFEngine(path, args.dtype, cfg, "cpu", HFSettings(compile=True)),
    }
    for engine in engines.values():
        engine.eos_ids = set()  # every row decodes its whole budget
    shape = ModelShape.from_config(engines["eager"].model.config)
    step_bytes = decode_weight_bytes(shape, args.dtype)
    memcpy = copy_gbps(torch.device("cpu"))
    print(
        f"memcpy {memcpy:.2f} GB/s; {args.model} {args.dtype}: {step_bytes / 1e6:.0f} MB of "
        "weights read per decode step",
        flush=True,
    )

    records = []
    for prompts, samples, tokens in workloads:
        name = f"{prompts}x{samples}x{tokens}"
        batch = ids[:prompts]
        sampling = SamplingParams(n=samples, max_new_tokens=tokens, temperature=1.0)

        def timed(engine: HFEngine, batch=batch, sampling=sampling) -> float:
            start = time.perf_counter()
            engine.generate(batch, sampling)
            return time.perf_counter() - start

        compile_s = [timed(engines["compiled"]) for _ in range(2)]
        print(
            f"{name}: compiled engine's first calls {compile_s[0]:.1f} s, {compile_s[1]:.1f} s",
            flush=True,
        )
        seconds: dict[str, list[float]] = {"eager": [], "compiled": []}
        loads = []
        for round_ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            order = ["eager", "compiled"] if round_ % 2 == 0 else ["compiled", "eager"]
            for label in order:
                seconds[label].append(timed(engines[label]))
        generated = prompts * samples * tokens
        speedups = [e / c for e, c in zip(seconds["eager"], seconds["compiled"], strict=True)]
        record = {
            "workload": name,
            "dtype": args.dtype,
            "compile_s": compile_s,
            "loads": loads,
            "memcpy_gbps": memcpy,
            "speedup_median": statistics.median(speedups),
            "speedups": speedups,
        }
        for label, runs in seconds.items():
            median = statistics.median(runs)
            record[label] = {
                "seconds": runs,
                "tokens_per_s": generated / median,
                "decode_bw_frac": step_bytes * tokens / median / 1e9 / memcpy,
            }
            print(
                f"  {label:8s} {median:7.2f} s  {generated / median:8.1f} tok/s  "
                f"decode_bw_frac {record[label]['decode_bw_frac']:.3f}  "
                f"(rounds: {', '.join(f'{s:.2f}' for s in runs)})",
                flush=True,
            )
        print(
            f"  compiled / eager speed: {record['speedup_median']:.2f}x "
            f"(rounds: {', '.join(f'{s:.2f}' for s in speedups)}; load before each: "
            f"{', '.join(f'{v:.1f}' for v in loads)})",
            flush=True,
        )
        records.append(record)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
