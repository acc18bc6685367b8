"""Short learner save/teardown cycles under load, counting learner ranks that abort (the
``malloc(): unaligned tcache chunk detected`` row of docs/status.md, issue 47).

Each cycle does what the end of a short ``rlsys train`` does to its learners: it starts a
learner group (``--ranks`` FSDP2 ranks on gloo, the built-in tiny model, fresh processes),
trains one step, publishes the weights through the object store (as a sync to the engines
does), saves a checkpoint and the Hugging Face export, then tears the group down as
``Pools.shutdown`` does (``destroy_process_group``, then ``ray.kill``). ``--burners`` processes
spin meanwhile, so the cycles run on an oversubscribed machine, as the aborts were seen.

The learners run with glibc's heap checks: ``MALLOC_CHECK_=3`` (glibc >= 2.34 honours it only
with ``libc_malloc_debug.so`` preloaded, which this script does) and ``MALLOC_PERTURB_`` (freed
and new memory filled with a byte, so a use after free reads garbage instead of stale data);
``--no-malloc-check`` runs them without, ``--no-malloc-tuning`` without rlsys's own malloc
settings (``placement.MALLOC_ENV``).

A rank that dies in a call is an abort; its Ray worker log is searched for the reason
(glibc's message, SIGABRT, ``terminate called``) and the lines are printed. The end prints one
line: ``cycles N, aborts A, seconds S`` (and where each abort happened).

    python scripts/learner_cycles.py                      # 200 cycles, 2 burners
    python scripts/learner_cycles.py --max-seconds 1800   # as many cycles as fit
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MALLOC_DEBUG = "libc_malloc_debug.so.0"
SECONDS: dict[str, float] = {}  # phase -> wall seconds over every cycle
SIGNS = re.compile(r"malloc|free\(\)|tcache|corrupt|SIGABRT|SIGSEGV|terminate called|Fatal Python")


def _burn(nice: int) -> None:
    os.nice(nice)
    while True:
        pass


def learner_env(malloc_check: bool, perturb: int) -> dict[str, str]:
    """What the learner processes get on top of rlsys's own settings."""
    env = {"MALLOC_PERTURB_": str(perturb)} if perturb else {}
    if malloc_check:
        env.update(MALLOC_CHECK_="3", LD_PRELOAD=MALLOC_DEBUG)
    return env


def toy_batch(model_dir: str, rows: int = 8):
    """``rows`` arithmetic prompts with random replies, advantages and old log-probs."""
    import numpy as np

    from rlsys.data.collate import pack
    from rlsys.models.loading import load_tokenizer

    tok = load_tokenizer(model_dir)
    rng = np.random.default_rng(0)
    prompts = [
        tok.encode(f"{a}+{b}=", add_special_tokens=False) for a, b in rng.integers(0, 99, (rows, 2))
    ]
    replies = [tok.encode(str(rng.integers(0, 999)), add_special_tokens=False) for _ in prompts]
    batch = pack(prompts, [r + [tok.eos_token_id] for r in replies], tok.pad_token_id)
    batch.old_logprobs = np.zeros_like(batch.loss_mask) - 3.0
    batch.advantages = rng.standard_normal(rows).astype(np.float32)[:, None] * batch.loss_mask
    return batch


def worker_logs(logs: Path, pid: int) -> list[str]:
    """The lines of Ray's worker logs of process ``pid`` that tell why it died."""
    lines = []
    for path in logs.glob(f"*-{pid}.*"):
        text = path.read_text(errors="replace")
        lines += [f"{path.name}: {line}" for line in text.splitlines() if SIGNS.search(line)]
    return lines


def _maps() -> str:
    return Path("/proc/self/maps").read_text()


def cycle(n: int, group_args: tuple, batch, objective, out: Path, logs: Path) -> str | None:
    """One start/train/publish/save/teardown cycle; the phase a rank died in, or None."""
    import ray

    from rlsys.weight_sync.base import SyncAddress
    from rlsys.weight_sync.object_store import ObjectStoreTransport, decode
    from rlsys.workers.learner import LearnerGroup

    phase, pids, group = "start", [], None
    clock = time.perf_counter()

    def enter(name: str) -> str:
        nonlocal clock
        now = time.perf_counter()
        SECONDS[phase] = SECONDS.get(phase, 0.0) + now - clock
        clock = now
        return name

    try:
        group = LearnerGroup(*group_args)
        pids = ray.get([w.pid.remote() for w in group.workers])
        if n == 1:  # the checks are really on in the learners
            maps = ray.get(group.workers[0].__ray_call__.remote(lambda _: _maps()))
            print(f"rank 0 maps libc_malloc_debug: {MALLOC_DEBUG.split('.')[0] in maps}")
        phase = enter("train_step")
        group.train_step(batch, objective, seed=n, num_mini_batches=1, epochs=1)
        phase = enter("publish_weights")
        rank0 = group.workers[0]
        ray.get(rank0.connect_weight_sync.remote(ObjectStoreTransport(), 1, SyncAddress("", 0)))
        sent = ray.get(group.publish_weights(1, 1 << 20))[0]
        for ref in sent.handle:  # read as an engine does, then drop
            decode(ray.get(ref))
        del sent
        phase = enter("save_checkpoint")
        group.save_checkpoint(str(out / "checkpoint"))
        phase = enter("save_hf")
        group.save_hf(str(out / "hf"))
        phase = enter("shutdown")
        ray.get([w.shutdown.remote() for w in group.workers], timeout=60)
        enter("")
        return None
    except Exception as exc:  # noqa: BLE001 - a dead rank: report it, go on
        print(f"cycle {n}: {phase} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        time.sleep(1.0)  # let the worker's log land
        for pid in pids:
            for line in worker_logs(logs, pid):
                print(f"  pid {pid}: {line[:300]}", flush=True)
        return phase
    finally:
        if group is not None:
            for w in group.workers:
                ray.kill(w)
        shutil.rmtree(out, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--max-seconds", type=float, default=0, help="stop after (0: no limit)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--burners", type=int, default=2, help="busy processes as load")
    parser.add_argument("--nice", type=int, default=10, help="the burners' niceness")
    parser.add_argument("--perturb", type=int, default=165, help="MALLOC_PERTURB_ (0: unset)")
    parser.add_argument("--no-malloc-check", action="store_true")
    parser.add_argument("--no-malloc-tuning", action="store_true")
    args = parser.parse_args()
    # before Ray and torch are imported: the burners are bare interpreters
    burners = [
        mp.Process(target=_burn, args=(args.nice,), daemon=True) for _ in range(args.burners)
    ]
    for b in burners:
        b.start()

    import ray

    from rlsys import placement
    from rlsys.algorithms.objectives import PolicyObjective
    from rlsys.config.learner import LearnerConfig, OptimConfig
    from rlsys.config.schema import ModelConfig
    from rlsys.models.loading import resolve_model_path
    from rlsys.placement import ActorResources

    if args.no_malloc_tuning:
        placement.MALLOC_ENV.clear()  # thread_env reads it when each actor is made
    env = learner_env(not args.no_malloc_check, args.perturb)
    model_dir = resolve_model_path(ModelConfig())
    tmp = Path(tempfile.mkdtemp(prefix="rlc-"))
    ray.init(
        num_cpus=args.ranks,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TRANSFORMERS_VERBOSITY": "error", **env}},
        _temp_dir=str(tmp / "ray"),
    )
    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    cfg = LearnerConfig(world_size=args.ranks, micro_batch_size=2, optim=OptimConfig(lr=1e-3))
    group_args = (cfg, ActorResources(num_cpus=1, num_gpus=0, threads=1), model_dir, "float32", 1.0)
    batch, objective = toy_batch(model_dir), PolicyObjective()
    print(
        f"{args.cycles} cycles of {args.ranks} FSDP2 ranks on gloo, {args.burners} burners "
        f"(nice {args.nice}); "
        f"learner env {env or '{}'}; rlsys malloc tuning "
        f"{'off' if args.no_malloc_tuning else placement.MALLOC_ENV}",
        flush=True,
    )
    started, aborts, done = time.perf_counter(), [], 0
    try:
        for n in range(1, args.cycles + 1):
            if args.max_seconds and time.perf_counter() - started > args.max_seconds:
                break
            phase = cycle(n, group_args, batch, objective, tmp / f"cycle{n}", logs)
            done = n
            if phase is not None:
                aborts.append(f"{n}:{phase}")
            if n % 10 == 0:
                elapsed = time.perf_counter() - started
                print(f"{n} cycles, {len(aborts)} aborts, {elapsed:.0f} s", flush=True)
    finally:
        for b in burners:
            b.terminate()
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    elapsed = time.perf_counter() - started
    per_cycle = ", ".join(f"{k} {v / max(done, 1):.1f}" for k, v in SECONDS.items())
    print(f"seconds per cycle by phase: {per_cycle}")
    print(
        f"cycles {done}, aborts {len(aborts)}, seconds {elapsed:.0f}"
        + (f" ({', '.join(aborts)})" if aborts else "")
    )
    return 1 if aborts else 0


if __name__ == "__main__":
    sys.exit(main())
