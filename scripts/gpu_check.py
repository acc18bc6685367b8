"""The one-GPU check: rlsys's GPU paths inside Ray on one GPU, one line per check and a JSON.

    python scripts/gpu_check.py [--out DIR] [--only a,b] [--skip a,b] [--cpu]

Runs on a machine with one CUDA GPU, torch and transformers, and the rest of rlsys's stack
(a machine with no package index gets it as a wheelhouse: scripts/wheelhouse.sh, and
docs/launching.md, "A GPU machine with no package index"). Every check runs whatever it checks
for real, records its figures or its failure, and the next one runs regardless:

  ray           Ray starts and offers the GPU
  placement     an FSDP2 learner rank and an HF engine colocated on that GPU through placement
                groups (rlsys.placement.gpu_slots): both report the same physical GPU and a
                CUDA device
  sync          CUDA IPC weight sync between the two Ray actors after a training step: the
                engine's weights equal the learner's bit for bit (and differed before it)
  qwen_shape    a random-weight model of Qwen2.5-0.5B's shape, built from its config: learner
                tokens/s, achieved TFLOP/s and MFU against the GPU's bf16 peak; HF engine
                generated tokens/s; refit seconds over CUDA IPC; one memory hand-over cycle
                (engine sleep, learner release, staged wake) with the bytes each stage moved
  deepspeed     one ZeRO-2 and one ZeRO-3 training step (where DeepSpeed is installed)
  grpo          `rlsys train`: 5 GRPO steps of the built-in model, colocated with engine sleep
                and CUDA IPC sync, bf16 engine and bf16 mixed-precision learner; its memory/*
  compiled      `rlsys train`: 2 GRPO steps with compiled decoder layers

``--cpu`` runs the CPU half (CI: tests/e2e/test_gpu_check.py): the same code on CPU, with Ray's
logical GPU for the placement, the object store for the sync, a small model in place of
Qwen2.5-0.5B's shape, and no DeepSpeed or compiled run (their CPU paths have tests of their
own). Figures from --cpu are not GPU figures. Writes ``DIR/gpu_check.json`` (default DIR:
./gpu_check).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # rlsys from this checkout

CHECKS = ["ray", "placement", "sync", "qwen_shape", "deepspeed", "grpo", "compiled"]
CPU_SKIPS = {"deepspeed", "compiled"}
QWEN25_05B = {  # Qwen2.5-0.5B's config.json, the fields that set its shape
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
SMALL_SHAPE = {**QWEN25_05B, "vocab_size": 4096, "hidden_size": 128, "intermediate_size": 256}
SMALL_SHAPE.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
TRAIN_RUN = [  # a short GRPO run of the built-in model (rlsys doctor's, shorter)
    "warm_start.enabled=false",
    "trainer.eval_every=0",
    "eval.num_prompts=16",
    "data.batch_size=8",
    "rollout.n_samples=4",
    "algorithm.filter_uniform_groups=false",
    "learner.world_size=1",
    "rollout.num_workers=1",
]
GPU_POOLS = ["learner.num_gpus_per_rank=1", "rollout.num_gpus_per_worker=1"]


class Check:
    """The current check's name, figures and status."""

    def __init__(self, name: str) -> None:
        self.name, self.figures, self.status, self.error = name, {}, "passed", None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="gpu_check")
    parser.add_argument("--only", default="", help="comma-separated checks to run")
    parser.add_argument("--skip", default="", help="comma-separated checks to leave out")
    parser.add_argument("--cpu", action="store_true", help="the CPU half (no GPU needed)")
    parser.add_argument("--json", help="where the report goes (default: OUT/gpu_check.json)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    json_path = Path(args.json) if args.json else out / "gpu_check.json"
    names = [c for c in (args.only.split(",") if args.only else CHECKS) if c]
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        parser.error(f"--only names unknown checks {unknown}; the checks are {CHECKS}")
    skip = {c for c in args.skip.split(",") if c} | (CPU_SKIPS if args.cpu else set())

    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --cpu for the CPU half", file=sys.stderr)
        return 2
    os.environ.setdefault("RLSYS_CACHE_DIR", str(out / "cache"))
    ctx = Context(args.cpu, out)
    report = {"machine": ctx.machine(), "checks": []}
    started = time.perf_counter()
    try:
        for name in names:
            check = Check(name)
            t0 = time.perf_counter()
            if name in skip:
                check.status = "skipped"
            else:
                try:
                    check.figures = globals()[f"check_{name}"](ctx) or {}
                except Exception as exc:  # noqa: BLE001 - recorded; the next check runs
                    check.status, check.error = "failed", f"{type(exc).__name__}: {exc}"
                    check.figures["traceback"] = traceback.format_exc()[-4000:]
            check.figures["seconds"] = round(time.perf_counter() - t0, 1)
            report["checks"].append(vars(check))
            shown = {k: v for k, v in check.figures.items() if k != "traceback"}
            line = check.error if check.error else json.dumps(shown)[:400]
            print(f"gpu_check: {name:<11} {check.status:<7} {line}", flush=True)
            json_path.write_text(json.dumps(report, indent=2))
    finally:
        ctx.close()
    report["total_s"] = round(time.perf_counter() - started, 1)
    json_path.write_text(json.dumps(report, indent=2))
    failed = [c["name"] for c in report["checks"] if c["status"] == "failed"]
    print(f"gpu_check: {len(failed)} failed {failed} in {report['total_s']} s -> {out}")
    return 1 if failed else 0


class Context:
    """What the checks share: the device kind, the output dir, a Ray started once and the
    pools of the checks that keep them (stopped before the `rlsys train` runs)."""

    def __init__(self, cpu: bool, out: Path) -> None:
        self.cpu, self.out = cpu, out
        self.pools = None  # the placement / sync checks' pools

    def machine(self) -> dict:
        import torch

        info = {"python": platform.python_version(), "torch": torch.__version__}
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
        for dist in ("ray", "transformers", "deepspeed", "hydra-core"):
            try:
                import importlib.metadata

                info[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                info[dist] = None
        info["mode"] = "cpu-half" if self.cpu else "gpu"
        return info

    def ray(self):
        import ray

        if not ray.is_initialized():
            from rlsys.runtime import quiet_libraries

            quiet_libraries()
            # the CPU half: a logical GPU, so placement groups and GPU requests are real
            ray.init(
                num_cpus=max(4, os.cpu_count() or 1),
                num_gpus=1,
                include_dashboard=False,
                runtime_env={"env_vars": {"RLSYS_CACHE_DIR": os.environ["RLSYS_CACHE_DIR"]}},
            )
        return ray

    def config(self, overrides: list[str]):
        from rlsys.resolve import load_config

        transport = "object_store" if self.cpu else "cuda_ipc"
        return load_config(
            [*TRAIN_RUN, *GPU_POOLS, f"weight_sync.transport={transport}", *overrides]
        )

    def stop_pools(self) -> None:
        if self.pools is not None:
            self.pools.shutdown()
            self.pools = None

    def close(self) -> None:
        import ray

        self.stop_pools()
        if ray.is_initialized():
            ray.shutdown()


def check_ray(ctx: Context) -> dict:
    ray = ctx.ray()
    resources = ray.cluster_resources()
    if resources.get("GPU", 0) < 1:
        raise RuntimeError(f"Ray offers no GPU: {resources}")
    return {"gpus": resources["GPU"], "cpus": resources.get("CPU")}


def _tiny_pools(ctx: Context, overrides: list[str]):
    from rlsys.models.loading import resolve_model_path
    from rlsys.placement.resources import Roles
    from rlsys.workers.pools import start_pools

    ctx.ray()
    cfg = ctx.config(overrides)
    return cfg, start_pools(cfg, resolve_model_path(cfg.model), Roles())


def check_placement(ctx: Context) -> dict:
    ctx.stop_pools()
    _, ctx.pools = _tiny_pools(ctx, ["model.dtype=bfloat16"])
    learner = ctx.pools.learner.devices()[0]
    engine = ctx.pools.rollout.devices()[0]
    device = "cpu" if ctx.cpu else "cuda"
    for role, report in (("learner", learner), ("engine", engine)):
        if report["device"] != device:
            raise RuntimeError(f"the {role} runs on {report['device']}, not {device}: {report}")
        if len(report["gpu_ids"]) != 1:
            raise RuntimeError(f"the {role} holds {report['gpu_ids']} GPUs, not one")
    if learner["gpu_ids"] != engine["gpu_ids"] or learner["node_id"] != engine["node_id"]:
        raise RuntimeError(f"learner on {learner['gpu_ids']}, engine on {engine['gpu_ids']}")
    return {
        "gpu": learner["gpu_ids"][0],
        "learner_visible": learner["cuda_visible_devices"],
        "engine_visible": engine["cuda_visible_devices"],
    }


def _train_once(group, rows: int, prompt: int, response: int, vocab: int, seed: int):
    """One policy step of ``group`` on random tokens with random advantages."""
    import numpy as np

    from rlsys.algorithms.objectives import PolicyObjective
    from rlsys.data.collate import pack

    rng = np.random.default_rng(seed)
    batch = pack(
        rng.integers(3, vocab, (rows, prompt)).tolist(),
        rng.integers(3, vocab, (rows, response)).tolist(),
        0,
    )
    batch.behaviour_logprobs = np.zeros_like(batch.loss_mask)
    batch.advantages = rng.standard_normal((rows, 1)).astype(np.float32) * batch.loss_mask
    return group.train_step(batch, PolicyObjective(), seed, 1, 1)


def check_sync(ctx: Context) -> dict:
    import ray

    if ctx.pools is None:
        _, ctx.pools = _tiny_pools(ctx, ["model.dtype=bfloat16"])
    pools = ctx.pools
    engine = pools.rollout.workers[0]
    _train_once(pools.learner, 8, 16, 16, 64, seed=0)
    learner = pools.learner.weights_digest("bfloat16")
    before = ray.get(engine.weights_digest.remote())
    stale = [n for n in learner if learner[n] != before.get(n)]
    if not stale:
        raise RuntimeError(
            "the training step changed no weight: the comparison would prove nothing"
        )
    start = time.perf_counter()
    sent = pools.sync_weights(1)
    seconds = time.perf_counter() - start
    after = ray.get(engine.weights_digest.remote())
    missing = sorted(set(learner) - set(after))
    differ = [n for n in learner if n in after and learner[n] != after[n]]
    if missing or differ:
        raise RuntimeError(f"not bit for bit: missing {missing[:3]}, differing {differ[:3]}")
    return {
        "transport": pools.transport.__class__.__name__,
        "tensors": len(learner),
        "changed_by_step": len(stale),
        "bytes": sent.num_bytes,
        "seconds": round(seconds, 4),
    }


def _peak_tflops() -> tuple[str | None, float | None]:
    """The GPU's name and its published dense bf16 peak (``rlsys.perf.machine``)."""
    import torch

    from rlsys.perf.machine import published_tflops

    if not torch.cuda.is_available():
        return None, None
    name = torch.cuda.get_device_name(0)
    return name, published_tflops(name, "bfloat16")


def check_qwen_shape(ctx: Context) -> dict:
    """Learner, engine and refit figures on a random model of Qwen2.5-0.5B's shape."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlsys.perf.flops import ModelShape, training_flops
    from rlsys.placement.resources import Roles
    from rlsys.types import SamplingParams
    from rlsys.workers.pools import start_pools

    ctx.stop_pools()
    ctx.ray()
    shape = SMALL_SHAPE if ctx.cpu else QWEN25_05B
    config = Qwen2Config(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    path = ctx.out / ("small-qwen2" if ctx.cpu else "qwen2.5-0.5b-shape")
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        with torch.device("cpu" if ctx.cpu else "cuda"):
            model = Qwen2ForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(path)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    rows, prompt, response = (4, 32, 32) if ctx.cpu else (16, 256, 768)
    micro = 4 if ctx.cpu else 8
    cfg = ctx.config(
        [
            "model.dtype=float32",
            "learner.mixed_precision=bfloat16",
            "rollout.dtype=bfloat16",
            f"learner.micro_batch_size={micro}",
            "learner.ppo_epochs=1",
            "rollout.micro_batch_size=64",
        ]
    )
    pools = ctx.pools = start_pools(cfg, str(path), Roles())
    dims = ModelShape.from_config(config)  # FLOPs: rlsys/perf/flops.py, docs/roofline.md
    figures: dict = {"model": path.name, "matmul_params": dims.body_params + dims.head_params}
    steps = []
    for step in range(4 if not ctx.cpu else 2):
        t0 = time.perf_counter()
        _train_once(pools.learner, rows, prompt, response, config.vocab_size, seed=step)
        steps.append(time.perf_counter() - t0)
    measured = steps[1:]  # the first step warms up (allocator, kernels)
    tokens = rows * (prompt + response)
    step_s = statistics.median(measured)
    # one epoch: a forward and backward over every row, the LM head on response positions
    flops = training_flops(dims, [prompt + response] * rows, rows * response) / step_s
    name, peak = _peak_tflops()
    figures.update(
        learner_step_s=[round(s, 3) for s in measured],
        learner_tokens_per_s=round(tokens / step_s),
        learner_tflops=round(flops / 1e12, 1),
        gpu=name,
        bf16_peak_tflops=peak,
        mfu=round(flops / 1e12 / peak, 3) if peak else None,
        batch=f"{rows} rows x {prompt + response} tokens, micro-batches of {micro}",
    )
    # generation: random prompts, sampled to the length limit (or EOS)
    import numpy as np

    rng = np.random.default_rng(0)
    n_prompts, new = (8, 16) if ctx.cpu else (64, 256)
    prompts = rng.integers(3, config.vocab_size, (n_prompts, 64)).tolist()
    t0 = time.perf_counter()
    groups = pools.generate(prompts, SamplingParams(n=1, max_new_tokens=new, seed=0))
    gen_s = time.perf_counter() - t0
    generated = sum(len(c.token_ids) for g in groups for c in g)
    figures.update(generated_tokens=generated, engine_tokens_per_s=round(generated / gen_s))
    # refit: the learner's weights into the engine, three times
    refits = []
    for version in range(1, 4):
        t0 = time.perf_counter()
        sent = pools.sync_weights(version)
        refits.append(time.perf_counter() - t0)
    figures.update(refit_s=[round(s, 3) for s in refits], refit_bytes=sent.num_bytes)
    figures["handover"] = _handover_cycle(pools, rows, prompt, response, config.vocab_size)
    ctx.stop_pools()
    return figures


def _handover_cycle(pools, rows: int, prompt: int, response: int, vocab: int) -> dict:
    """One colocated step's memory hand-over, as the controller runs it: engines sleep, the
    learner trains and releases its cache, the engines wake their weights, sync, KV cache."""
    slept = pools.rollout.sleep()
    _train_once(pools.learner, rows, prompt, response, vocab, seed=9)
    released = pools.release_memory()
    weights = pools.rollout.wake(("weights",))
    pools.sync_weights(9)
    kv = pools.rollout.wake(("kv_cache",))
    gib = 2**30
    return {
        "engine_freed_gib": round(sum(s["freed_bytes"] for s in slept) / gib, 3),
        **{
            k.removeprefix("memory/").replace("bytes", "gib"): round(v / gib, 3)
            for k, v in released.items()
        },
        "engine_wake_gib": round(sum(w["taken_bytes"] or 0 for w in weights) / gib, 3),
        "engine_kv_wake_gib": round(sum(w["taken_bytes"] or 0 for w in kv) / gib, 3),
    }


def check_deepspeed(ctx: Context) -> dict:
    try:
        import deepspeed  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"DeepSpeed is not installed here ({exc})") from exc
    from rlsys.models.loading import resolve_model_path
    from rlsys.placement.resources import Roles, plan_placement
    from rlsys.workers.learner import LearnerGroup

    ctx.stop_pools()
    ctx.ray()
    figures = {}
    for stage in (2, 3):
        cfg = ctx.config(["learner.backend=deepspeed", f"learner.deepspeed.zero_stage={stage}"])
        placement = plan_placement(cfg, Roles())
        group = LearnerGroup(
            cfg.learner, placement.learner, resolve_model_path(cfg.model), cfg.model.dtype, 1.0
        )
        try:
            t0 = time.perf_counter()
            metrics = _train_once(group, 8, 16, 16, 64, seed=stage)
            figures[f"zero{stage}_step_s"] = round(time.perf_counter() - t0, 3)
            figures[f"zero{stage}_grad_norm"] = round(metrics["grad_norm"], 4)
        finally:
            group.shutdown()
            placement.release()
    return figures


def _train_run(ctx: Context, name: str, overrides: list[str]) -> dict:
    from rlsys.run.bench import run_train

    ctx.close()  # `rlsys train` starts a Ray of its own: this one's pools must not hold the GPU
    transport = "object_store" if ctx.cpu else "cuda_ipc"
    extra = ["cluster.num_gpus=1", "placement.engine_sleep=true"] if ctx.cpu else []
    run = run_train(
        name,
        [*TRAIN_RUN, *GPU_POOLS, f"weight_sync.transport={transport}", *extra, *overrides],
        ctx.out / "runs",
        timeout=300,
    )
    memory = {}
    for record in run.metrics:
        for key, value in record.items():
            if key.startswith("memory/"):
                memory.setdefault(key, []).append(value)
    s = run.summary
    return {
        "steps": s["steps"],
        "train_wall_s": round(s["train_wall_s"], 1),
        "samples_per_s": round(s["samples_per_s"], 1),
        "memory_gib": {k: round(statistics.mean(v) / 2**30, 3) for k, v in sorted(memory.items())},
        "weight_sync_s": [
            round(m["time/weight_sync"], 4) for m in run.metrics if "time/weight_sync" in m
        ],
        "run_dir": str(ctx.out / "runs" / name),
    }


def check_grpo(ctx: Context) -> dict:
    steps = 2 if ctx.cpu else 5
    precision = [] if ctx.cpu else ["learner.mixed_precision=bfloat16", "rollout.dtype=bfloat16"]
    figures = _train_run(ctx, "grpo", [f"trainer.total_steps={steps}", *precision])
    if figures["steps"] != steps:
        raise RuntimeError(f"{figures['steps']} steps of {steps} ran")
    if "memory/engine_freed_bytes" not in figures["memory_gib"]:
        raise RuntimeError(f"no memory/* hand-over metrics: {figures['memory_gib']}")
    return figures


def check_compiled(ctx: Context) -> dict:
    return _train_run(ctx, "compiled", ["trainer.total_steps=2", "learner.compile=true"])


if __name__ == "__main__":
    sys.exit(main())
