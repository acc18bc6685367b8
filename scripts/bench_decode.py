"""The HF engine's decode loop in its variants (``rollout.engine_args``), side by side.

    python scripts/bench_decode.py [--model smollm2-135m] [--task arithmetic_chat]
        [--dtype bfloat16] [--workloads 2x8x128,4x8x16] [--variants sdpa,matmul]
        [--repeats 3] [--natural] [--profile N] [--json out.json]

A workload ``PxSxT`` is P prompts (the task's first training prompts, rendered as rlsys sends
them) x S samples x T new tokens, sampled at temperature 1 in one ``generate`` call. Every row
decodes its whole budget (the engine's end tokens are cleared), so every loop takes the same
decode steps whatever it samples; with ``--natural`` rows end at the model's own end tokens
instead, as in training, so a variant that drops ended rows (``shrink``) shows what it saves
(the variants then sample different replies: compare the mean reply length and the decode
steps printed beside the times; ``decode_bw_frac`` still counts the budget's decode steps
there, an upper bound). One engine per variant holds the same weights in
``--dtype``: ``sdpa`` (decode steps through torch's SDPA kernel), ``matmul`` (decode steps as
two matmuls, ``decode_attention=matmul``, the CPU default), ``shared`` (``matmul`` with each
prompt prefilled once for its samples, ``share_prefill``, the default; the other variants
prefill every sample's row, as the engine did before it) and ``compiled`` (a static KV cache
and ``torch.compile`` of the forward step, ``compile=true``, attending through SDPA as when it
was first measured), ``shared`` being transformers' ``generate`` loop, which decodes every row
until the longest ends, ``shrink`` (``shared`` in rlsys's own loop, where a row that ended
leaves the batch, ``shrink_batch``), ``prepacked`` (the default now: ``shrink`` with the
linear weights packed for oneDNN once per weight version, ``prepack``; every other variant
multiplies by the plain weights, as the engine did when it was measured; since 2026-11-30 the
default also prefills the head its distinct prompts share once, rlsys/engines/prefill.py,
and so do ``shared`` and ``shrink``) and ``unshared`` (``prepacked`` with every row's prompt
prefilled whole: ``share_prefill`` off, against which the default's prefill shows) and
``concat`` (``prepacked`` on transformers' dynamic cache, which copies the whole KV cache
every step: ``cache_in_place`` off; since 2026-12-03 the default and ``shrink`` write each
step's token in place, rlsys/engines/kv_cache.py) and ``unfused`` (``prepacked`` with each
sibling layer packed and called on its own: ``fuse_linears`` off; since 2026-12-04 the
default multiplies q/k/v and gate/up as one weight each). Each
engine's first two calls of each workload are timed apart as warm-up (``warmup_s``; for the compiled engine, its compile:
the second call with a static cache of the final size can still recompile). Then
``--repeats`` rounds run the variants in turn (the order rotates each round, so drift on a
shared machine falls on all); per workload it prints each variant's median seconds and
generated tokens/s, each variant's speed over the first one's per round and its median, and
``decode_bw_frac``: the weight bytes one decode step reads x the decode steps, over the
seconds, over this machine's memory-copy bandwidth measured in the same run
(docs/roofline.md). The load average before each round is recorded: on 2 cores a load above
~2 means something else shared them; so is the share of CPU time stolen during each round
(/proc/stat: on a virtual machine, time the hypervisor gave other guests, which the load
average does not show; a round with much of it is noisy). The CPU line (model, AMX) comes first. ``--profile N``
adds, per workload, one more call of each variant under ``torch.profiler``, and prints the N
operations with the most own CPU time: where a variant's seconds go.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# each variant's rollout.engine_args (HFSettings); all but ``shrink`` and ``prepacked`` decode
# in transformers' generate, which runs every row until the longest ends; all but
# ``prepacked`` multiply by F.linear's weights, as the engine did when they were measured
PLAIN = {"prepack": False}
VARIANTS = {
    "sdpa": {"decode_attention": "sdpa", "share_prefill": False, "shrink_batch": False, **PLAIN},
    "matmul": {
        "decode_attention": "matmul",
        "share_prefill": False,
        "shrink_batch": False,
        **PLAIN,
    },
    "compiled": {"compile": True, "decode_attention": "sdpa"},
    "shared": {"decode_attention": "matmul", "shrink_batch": False, **PLAIN},
    "shrink": {"decode_attention": "matmul", **PLAIN},  # rows that ended leave the batch
    "prepacked": {"decode_attention": "matmul"},  # the default: shrink, weights prepacked
    "unshared": {"decode_attention": "matmul", "share_prefill": False},  # every row prefilled
    "concat": {"decode_attention": "matmul", "cache_in_place": False},  # transformers' cache
    "unfused": {"decode_attention": "matmul", "fuse_linears": False},  # q/k/v, gate/up apart
}


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


def _percents(fracs: list[float]) -> str:
    return ", ".join(f"{f:.0%}" for f in fracs)


def _prompt_ids(model: str, task: str, count: int) -> tuple[str, list[list[int]]]:
    """The model directory and the task's first ``count`` training prompts as token ids."""
    from rlsys.data.tasks import load_task
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.resolve import load_config
    from rlsys.trainers.collector import RolloutCollector

    cfg = load_config([f"model={model}", f"task={task}"])
    path = resolve_model_path(cfg.model)
    collector = RolloutCollector.for_task(None, load_tokenizer(path), cfg.task, cfg.reward)
    return path, collector.encode(load_task(cfg.task, cfg.run.seed).train[:count])[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a conf/model preset")
    parser.add_argument("--task", default="arithmetic_chat", help="a conf/task preset")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--workloads", default="2x8x128,4x8x16")
    parser.add_argument(
        "--variants",
        default="sdpa,matmul",
        help=f"comma-separated, the first is the baseline: {', '.join(VARIANTS)}",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--natural", action="store_true", help="rows end at the model's end tokens (as in RL)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="per workload, one more call of each variant under torch.profiler: its top N ops",
    )
    parser.add_argument("--json", help="write one record per workload here")
    args = parser.parse_args()
    workloads = [_workload(w) for w in args.workloads.split(",") if w]
    if not workloads or args.repeats < 1 or args.profile < 0:
        parser.error("give at least one workload, --repeats >= 1 and --profile >= 0")
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or len(variants) < 2 or len(set(variants)) < len(variants):
        parser.error(f"--variants: give two or more distinct ones of {', '.join(VARIANTS)}")

    import torch

    from rlsys.config.schema import RolloutConfig
    from rlsys.engines.hf import HFEngine
    from rlsys.engines.settings import HFSettings
    from rlsys.perf.flops import ModelShape, decode_weight_bytes
    from rlsys.perf.machine import copy_gbps, cpu_info, cpu_times, steal_frac
    from rlsys.types import SamplingParams

    print(cpu_info().line(), flush=True)
    torch.set_num_threads(cpu_info().cores)
    path, ids = _prompt_ids(args.model, args.task, max(p for p, _, _ in workloads))
    cfg = RolloutConfig()
    engines = {
        v: HFEngine(path, args.dtype, cfg, "cpu", HFSettings(**VARIANTS[v])) for v in variants
    }
    for engine in engines.values():
        if not args.natural:
            engine.eos_ids = set()  # every row decodes its whole budget
    base = variants[0]
    shape = ModelShape.from_config(engines[base].model.config)
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

        replies: dict[str, list[int]] = {v: [] for v in variants}  # tokens, per row

        def timed(
            engine: HFEngine, label: str, batch=batch, sampling=sampling, replies=replies
        ) -> float:
            start = time.perf_counter()
            groups = engine.generate(batch, sampling)
            seconds = time.perf_counter() - start
            replies[label].extend(len(c.token_ids) for g in groups for c in g)
            return seconds

        warmup = {v: [timed(engines[v], v) for _ in range(2)] for v in variants}
        print(
            f"{name}: first two calls "
            + "; ".join(f"{v} {a:.1f} s, {b:.1f} s" for v, (a, b) in warmup.items()),
            flush=True,
        )
        seconds: dict[str, list[float]] = {v: [] for v in variants}
        loads, steals = [], []
        for round_ in range(args.repeats):
            loads.append(os.getloadavg()[0])
            shift = round_ % len(variants)
            before = cpu_times()
            for label in variants[shift:] + variants[:shift]:
                seconds[label].append(timed(engines[label], label))
            steals.append(steal_frac(before, cpu_times()))
        record = {
            "workload": name,
            "dtype": args.dtype,
            "loads": loads,
            "steal_fracs": steals,
            "memcpy_gbps": memcpy,
        }
        for label, runs in seconds.items():
            median = statistics.median(runs)
            # mean tokens a call generated (every row's budget unless --natural)
            generated = statistics.mean(replies[label]) * prompts * samples
            speedups = [b / s for b, s in zip(seconds[base], runs, strict=True)]
            record[label] = {
                "seconds": runs,
                "warmup_s": warmup[label],
                "tokens_per_s": generated / median,
                "decode_bw_frac": step_bytes * tokens / median / 1e9 / memcpy,
                "mean_reply_tokens": statistics.mean(replies[label]),
                "longest_reply_tokens": max(replies[label]),
                "speedups": speedups,
                "speedup_median": statistics.median(speedups),
            }
            print(
                f"  {label:8s} {median:7.2f} s  {generated / median:8.1f} tok/s  "
                f"decode_bw_frac {record[label]['decode_bw_frac']:.3f}  "
                f"replies {record[label]['mean_reply_tokens']:.1f} tokens, longest "
                f"{record[label]['longest_reply_tokens']}  "
                f"(rounds: {', '.join(f'{s:.2f}' for s in runs)})",
                flush=True,
            )
        for label in variants[1:]:
            print(
                f"  {label} / {base} speed: {record[label]['speedup_median']:.2f}x (rounds: "
                f"{', '.join(f'{s:.2f}' for s in record[label]['speedups'])})",
                flush=True,
            )
        print(f"  load before each round: {', '.join(f'{v:.1f}' for v in loads)}", flush=True)
        if None not in steals:
            print(f"  CPU time stolen in each round: {_percents(steals)}", flush=True)
        records.append(record)
        if args.profile:
            for label in variants:
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                    engines[label].generate(batch, sampling)
                table = p.key_averages().table(
                    sort_by="self_cpu_time_total", row_limit=args.profile, max_name_column_width=40
                )
                print(f"  {label}, one call under torch.profiler:\n{table}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
