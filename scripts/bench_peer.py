"""rlsys against TRL's GRPOTrainer at matched workloads, interleaved, on this machine.

    python scripts/bench_peer.py [--workloads tiny,smollm2,smollm2_long] [--precision fp32,bf16]
                                 [--pairs 2] [--steps 4] [--warmup 1] [--async-row]
                                 [--compile] [--json out.json] [--rlsys key=value ...]

Each pair runs both systems once, one after the other (the order alternates between pairs, so
drift on a shared machine falls on both), as separate processes from the same model files and
the same prompts. A run's figure is its median seconds per step after ``--warmup`` steps;
samples/s is prompts x samples over that. The ratio is rlsys samples/s over TRL's, per pair,
and its median over pairs is the result. The load average before each run is recorded: on
2 cores, a load above 2 means something else took a core and the pair is noisy; so is the
share of CPU time stolen during the run (/proc/stat: on a virtual machine, time the
hypervisor gave other guests, which the load average does not show).

The peer lives in its own venv, made once under the rlsys cache (``peer/trl-<version>``):
the CPU build of torch at rlsys's pinned version (scripts/setup_torch.sh), then
``trl==1.16.0 transformers==5.23.0 accelerate==1.15.0 datasets==5.2.0``, about 3 minutes.
``--peer-venv DIR`` puts it elsewhere.

Matched on both sides: the model weights (rlsys's cached Hugging Face directory, float32),
the prompts (rendered by rlsys: the chat template applied for chat tasks; TRL gets the text),
prompts per step, samples per prompt, max new tokens, temperature 1, one optimizer step per
batch (``learner.ppo_epochs=1``, ``num_iterations=1``), no KL term, no reference model,
learning rate, every group trained (rlsys ``algorithm.filter_uniform_groups=false``), the
CPU threads (rlsys: its default placement over the machine's cores; TRL: one process with
all of them), the precision (``--precision``): ``fp32`` everywhere, or ``bf16`` mixed precision
on both sides (fp32 weights and optimizer state, forward passes in bf16: rlsys
``learner.mixed_precision=bfloat16`` with its engine's weights in bf16, ``rollout.dtype``;
TRL ``bf16=True``, accelerate's autocast around every forward pass, generation included),
and with ``--compile`` torch.compile on both sides (rlsys ``learner.compile=true``: each
decoder layer compiled; TRL ``torch_compile=True``: the whole model for its training passes;
the precision label gets ``+compile``). Compiling costs the first steps: TRL's recompiled
for its first ~8 steps of the tiny workload (1.7-2.2 s each), so use ``--steps 24 --warmup
10`` there. Each workload's rlsys overrides (``Workload.rlsys``: one learner rank with every core, which
beats two one-core ranks on 2 cores; on SmolLM2 packed micro-batches, each group's chat prompt
held once, ``learner.packing``) are listed with it below.

Different, and why: the reward. rlsys scores with its task's verifier; TRL's runner
(scripts/peer/trl_grpo.py) checks the reply's last number with a regex, because rlsys is not
installed in the peer's venv. Rewards change no per-step work except through completion
lengths, which both sides record (``completion_tokens``). rlsys's steps include its weight
sync to the engines (TRL generates with the model it trains); rlsys's own evaluation is off
(``trainer.eval_every=0``) and the final evaluation's seconds are subtracted. The loss
aggregation is each side's default (rlsys token mean, TRL ``dapo``): the same token-level
work. ``--async-row`` adds rlsys with ``buffer.max_staleness=1`` (one-step-off generation; the
learner and the engine then run at once, so each gets half the cores: ``ASYNC``), labelled
as such: TRL's GRPOTrainer is synchronous. It prints the CPU line (model, AMX) first, and
each rlsys run's median MFU (``perf/mfu``: docs/roofline.md) beside its seconds per step, and
its medians of ``time/generation`` and ``time/train`` (the JSON records also carry
``weight_sync``), so a ratio can be read stage by stage.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEER_PINS = ["trl==1.16.0", "transformers==5.23.0", "accelerate==1.15.0", "datasets==5.2.0"]
LR = 1e-6  # small: the policy barely moves, so both sides see like completion lengths


@dataclass(frozen=True)
class Workload:
    model: str  # conf/model preset
    task: str  # conf/task preset
    prompts: int
    samples: int
    new_tokens: int
    rlsys: list[str] = field(default_factory=list)  # rlsys overrides of this workload
    task_args: list[str] = field(default_factory=list)  # task overrides (both sides' prompts)


CPUS = os.cpu_count() or 1
# synchronous: the learner and the engine take turns, each with every core
ONE_RANK = [
    "learner.world_size=1",
    f"learner.num_cpus_per_rank={CPUS}",
    f"rollout.num_cpus_per_worker={CPUS}",
    "learner.micro_batch_size=64",
]
# one-step-off: the learner and the engine run at once, so they split the cores
ASYNC = [
    "buffer.max_staleness=1",
    f"learner.num_cpus_per_rank={max(1, CPUS // 2)}",
    f"rollout.num_cpus_per_worker={max(1, CPUS - CPUS // 2)}",
]
COMPILE = ["learner.compile=true"]  # --compile; TRL gets torch_compile=True
# packed micro-batches, a group's chat prompt held once (learner.share_prompts, on with
# packing): rlsys's setting for chat prompts, which outweigh their short replies here
PACKED = ["learner.packing=true"]
WORKLOADS = {
    "tiny": Workload("tiny-3m", "arithmetic", 8, 8, 8, ONE_RANK),
    "smollm2": Workload("smollm2-135m", "arithmetic_chat", 4, 8, 16, ONE_RANK + PACKED),
    # generation dominates: asked to explain, the model writes ~60-128 tokens a reply
    "smollm2_long": Workload(
        "smollm2-135m",
        "arithmetic_chat",
        2,
        8,
        128,
        ONE_RANK + PACKED,
        ["task.instruction='Explain each step of the addition, then give the final answer.'"],
    ),
}
# the stages of an rlsys step whose medians each record carries beside the step time
STAGES = ("time/generation", "time/train", "time/weight_sync")
# rlsys overrides and TRL's bf16 flag per --precision value
PRECISIONS = {
    "fp32": ([], False),
    "bf16": (["learner.mixed_precision=bfloat16", "rollout.dtype=bfloat16"], True),
}


def _torch_version() -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith("torch=="):
            return line.split("==")[1].strip()
    raise SystemExit("bench_peer: constraints.txt pins no torch version")


def peer_python(venv: Path) -> Path:
    """The peer venv's interpreter, making the venv first if it is missing or stale."""
    python = venv / "bin" / "python"
    stamp = venv / ".rlsys-peer"
    key = " ".join([f"torch=={_torch_version()}", *PEER_PINS])
    if stamp.exists() and stamp.read_text() == key:
        return python
    print(f"bench_peer: creating the peer venv {venv} ({key}); about 3 minutes", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup_torch.sh"), _torch_version()], check=True, env=env
    )
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
        pins.write(f"torch=={_torch_version()}\n")
    try:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "-c", pins.name, *PEER_PINS],
            check=True,
            env=env,
        )
    finally:
        os.unlink(pins.name)
    stamp.write_text(key)
    return python


def _prompts(work: Workload, count: int) -> tuple[str, bool, list[str], list[str]]:
    """The model directory, whether it has the built-in char tokenizer, and ``count`` training
    prompts rendered as rlsys sends them, with their answers."""
    from rlsys.data.tasks import load_task
    from rlsys.models.builtin import saved_char_tokenizer
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.resolve import load_config
    from rlsys.trainers.collector import RolloutCollector

    cfg = load_config([f"model={work.model}", f"task={work.task}", *work.task_args])
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path)
    task = load_task(cfg.task, cfg.run.seed)
    render = RolloutCollector.for_task(None, tokenizer, cfg.task, cfg.reward).prompt_format
    chosen = task.train[:count]
    texts = [render.render(p.text, tokenizer) for p in chosen]
    return path, saved_char_tokenizer(path), texts, [p.answer for p in chosen]


def _steady(seconds: list[float], warmup: int) -> float:
    kept = seconds[warmup:]
    if not kept:
        raise SystemExit(f"bench_peer: no steps left after {warmup} warm-up steps")
    return statistics.median(kept)


def run_rlsys(work: Workload, steps: int, warmup: int, extra: list[str], tmp: Path) -> dict:
    """One ``rlsys train`` process; per-step seconds from its metrics."""
    out = tmp / f"rlsys-{time.monotonic_ns()}"
    overrides = [
        f"model={work.model}",
        f"task={work.task}",
        *work.task_args,
        "warm_start.enabled=false",
        f"data.batch_size={work.prompts}",
        f"rollout.n_samples={work.samples}",
        f"task.max_new_tokens={work.new_tokens}",
        "rollout.temperature=1.0",
        "learner.ppo_epochs=1",
        "learner.num_mini_batches=1",
        "algorithm.kl_coef=0.0",
        "algorithm.filter_uniform_groups=false",
        f"learner.optim.lr={LR}",
        "learner.optim.warmup_steps=0",
        f"trainer.total_steps={steps}",
        "trainer.eval_every=0",
        "eval.num_prompts=4",
        "checkpoint.every=0",
        f"run.output_dir={out}",
        "run.name=bench",
        *work.rlsys,
        *extra,
    ]
    wall = _timed("rlsys train", [sys.executable, "-m", "rlsys.cli", "train", *overrides])
    records = [
        json.loads(line)
        for line in (out / "bench" / "metrics.jsonl").read_text().splitlines()
        if "perf/step_s" in line
    ]
    seconds = [r["perf/step_s"] - r.get("time/eval", 0.0) for r in records]
    tokens = [r.get("rollout/response_tokens", 0.0) for r in records]
    figures = _figures(seconds, tokens, warmup, wall)
    for key in ("perf/mfu", *STAGES):  # docs/roofline.md, docs/metrics.md
        kept = [r[key] for r in records[warmup:] if key in r]
        if kept:
            figures[key.split("/")[1]] = statistics.median(kept)
    return figures


def run_trl(python: Path, spec: dict, warmup: int, tmp: Path) -> dict:
    """One TRL GRPOTrainer process (scripts/peer/trl_grpo.py)."""
    spec_path = tmp / f"spec-{time.monotonic_ns()}.json"
    out_path = spec_path.with_suffix(".out.json")
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    runner = [str(python), str(ROOT / "scripts" / "peer" / "trl_grpo.py"), spec_path, out_path]
    wall = _timed("the TRL run", runner, env=env)
    report = json.loads(out_path.read_text())
    seconds = [s["s"] for s in report["steps"]]
    tokens = [s.get("completion_tokens", 0.0) for s in report["steps"]]
    return {**_figures(seconds, tokens, warmup, wall), "trl": report["trl"]}


def _timed(what: str, argv: list, **kwargs) -> float:
    """Run ``argv`` from the repository root; its wall seconds, or exit with its stderr."""
    started = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"bench_peer: {what} failed:\n{result.stderr[-3000:]}")
    return time.perf_counter() - started


def _figures(seconds: list[float], tokens: list[float], warmup: int, wall: float) -> dict:
    """A run's record: median seconds per step after ``warmup``, every step's seconds, the
    mean completion tokens after ``warmup``, the process's wall time."""
    kept = tokens[warmup:]
    return {
        "s_per_step": _steady(seconds, warmup),
        "step_s": seconds,
        "completion_tokens": statistics.mean(kept) if kept else 0.0,
        "wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workloads", default="tiny,smollm2")
    parser.add_argument("--precision", default="fp32", help="comma list: fp32, bf16")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--async-row", action="store_true", help="add buffer.max_staleness=1")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile on both sides: rlsys learner.compile=true, TRL torch_compile=True",
    )
    parser.add_argument("--peer-venv", type=Path)
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--rlsys", nargs="*", default=[], help="extra rlsys overrides")
    args = parser.parse_args()
    names = [n for n in args.workloads.split(",") if n]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: unknown {unknown}; known: {sorted(WORKLOADS)}")
    precisions = [p for p in args.precision.split(",") if p]
    if not precisions or any(p not in PRECISIONS for p in precisions):
        parser.error(f"--precision {args.precision!r}: pick from {sorted(PRECISIONS)}")
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")

    from rlsys.run.bench import write_records
    from rlsys.run.cache import cache_dir

    venv = args.peer_venv or cache_dir() / "peer" / PEER_PINS[0].replace("==", "-")
    python = peer_python(venv)
    from rlsys.perf.machine import cpu_info

    print(cpu_info().line(), flush=True)
    records = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for name in names:
            work = WORKLOADS[name]
            path, char, prompts, answers = _prompts(work, 512)
            for precision in precisions:
                extra, bf16 = PRECISIONS[precision]
                extra = [*extra, *(COMPILE if args.compile else []), *args.rlsys]
                spec = {
                    "model_dir": path,
                    "char_tokenizer": char,
                    "prompts": prompts,
                    "answers": answers,
                    "prompts_per_step": work.prompts,
                    "n_samples": work.samples,
                    "max_new_tokens": work.new_tokens,
                    "steps": args.steps,
                    "lr": LR,
                    "temperature": 1.0,
                    "seed": 0,
                    "threads": CPUS,
                    "bf16": bf16,
                    "torch_compile": args.compile,
                }
                systems = {
                    "trl": lambda spec=spec: run_trl(python, spec, args.warmup, tmp),
                    "rlsys": lambda work=work, extra=extra: run_rlsys(
                        work, args.steps, args.warmup, extra, tmp
                    ),
                }
                if args.async_row:
                    systems["rlsys_async1"] = lambda work=work, extra=extra: run_rlsys(
                        work, args.steps, args.warmup, [*extra, *ASYNC], tmp
                    )
                label = f"{precision}+compile" if args.compile else precision
                records += _pairs(name, label, work, systems, args.pairs)
    print(_table(records))
    if args.json_path:
        write_records(args.json_path, records)
    return 0


def _pairs(name: str, precision: str, work: Workload, systems: dict, pairs: int) -> list[dict]:
    """Run every system ``pairs`` times, alternating the order; a record per run."""
    from rlsys.perf.machine import cpu_times, steal_frac

    records = []
    for pair in range(pairs):
        order = list(systems) if pair % 2 == 0 else list(reversed(systems))
        for system in order:
            load, before = os.getloadavg()[0], cpu_times()
            result = systems[system]()
            steal = steal_frac(before, cpu_times())
            record = {
                "workload": name,
                "precision": precision,
                "system": system,
                "pair": pair,
                "load_before": round(load, 2),
                "steal_frac": steal,
                "samples_per_s": work.prompts * work.samples / result["s_per_step"],
                **result,
            }
            records.append(record)
            extra = f"  stolen {steal:.0%}" if steal is not None else ""
            extra += f"  MFU {result['mfu']:.1%}" if "mfu" in result else ""
            if "generation" in result:
                extra += (
                    f"  (generation {result['generation']:.2f} s, train {result['train']:.2f} s)"
                )
            print(
                f"{name:8s} {precision} pair {pair} {system:13s} "
                f"{result['s_per_step']:7.3f} s/step {record['samples_per_s']:7.1f} samples/s  "
                f"{result['completion_tokens']:5.1f} tokens  load {load:.2f}{extra}",
                flush=True,
            )
    return records


def _table(records: list[dict]) -> str:
    rows = [
        "| workload | precision | system | s/step (median of pairs) | samples/s | ratio to TRL "
        "(median of pairs) | pair ratios |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, precision in dict.fromkeys((r["workload"], r["precision"]) for r in records):
        mine = [r for r in records if (r["workload"], r["precision"]) == (name, precision)]
        trl = {r["pair"]: r["samples_per_s"] for r in mine if r["system"] == "trl"}
        for system in dict.fromkeys(r["system"] for r in mine):
            runs = [r for r in mine if r["system"] == system]
            ratios = [r["samples_per_s"] / trl[r["pair"]] for r in runs]
            rows.append(
                f"| {name} | {precision} | {system} "
                f"| {statistics.median(r['s_per_step'] for r in runs):.3f} "
                f"| {statistics.median(r['samples_per_s'] for r in runs):.1f} "
                f"| {statistics.median(ratios):.2f} | {', '.join(f'{x:.2f}' for x in ratios)} |"
            )
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
