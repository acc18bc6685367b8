"""Short learner save/teardown cycles under load, counting learner ranks that abort (the
``malloc(): unaligned tcache chunk detected`` row of docs/status.md, issue 47).

Each cycle does what the end of a short ``rlsys train`` does to its learners: it sets up a
learner group (``--ranks`` FSDP2 ranks on gloo, the built-in tiny model: a new process group
and backend), trains one step, publishes the weights through the object store (as a sync to
the engines does), saves a checkpoint and the Hugging Face export (``save_hf``), then leaves
the process group as ``Pools.shutdown`` does first. The rank processes are new every
``--respawn-every`` cycles (1: every cycle, as a run's are; killed with ``ray.kill``).
``--burners`` processes spin meanwhile (at ``--nice``), so the cycles run on an
oversubscribed machine, as the aborts were seen.

The learners run with ``MALLOC_PERTURB_`` (new chunks filled with a byte, freed ones that do
not go to a tcache bin with another) and, unless ``--no-malloc-check``, ``MALLOC_CHECK_=3``
with ``libc_malloc_debug.so`` preloaded (glibc >= 2.34 ignores the variable without it);
``--no-malloc-tuning`` drops rlsys's own malloc settings (``placement.MALLOC_ENV``). What
fired in the recorded aborts is glibc's tcache check, on whatever the settings; and under
this project's Python (pyenv 3.11.7, shared libpython) MALLOC_CHECK_ does nothing even
preloaded: ``--self-test`` shows both in an actor of the learners' environment (a one-byte
overflow that malloc-check reports under Debian's python3 goes unnoticed; a write over a
freed chunk's tcache link aborts with the recorded message).

A rank that dies in a call is an abort; its Ray worker log is searched for the reason
(glibc's message, SIGABRT, ``terminate called``) and the lines are printed. The end prints one
line: ``cycles N, aborts A, seconds S`` (and where each abort happened).

    python scripts/learner_cycles.py                      # 200 cycles, 2 burners
    python scripts/learner_cycles.py --max-seconds 1800   # as many cycles as fit
    python scripts/learner_cycles.py --no-malloc-check --respawn-every 10 --self-test
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


class _Probe:
    """An actor with the learners' environment that corrupts its heap (--self-test)."""

    def pid(self) -> int:
        return os.getpid()

    def write_after_free(self) -> str:
        return _uaf()

    def overflow_by_one(self) -> str:
        """One byte past a chunk's usable size, then free: only malloc-check notices."""
        import ctypes

        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
        chunk = libc.malloc(64)
        ctypes.memset(chunk, 0x41, libc.malloc_usable_size(chunk) + 1)
        libc.free(chunk)
        return "no abort"


def _uaf() -> str:
    """A write after free into a freed chunk of the largest tcache size (1000 bytes: one the
    crash handler's own mallocs do not reach), then the mallocs that reuse it."""
    import ctypes

    libc = ctypes.CDLL(None)  # the malloc every library calls (a preloaded one included)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    first, second = libc.malloc(1000), libc.malloc(1000)
    libc.free(first)
    libc.free(second)  # the head of its tcache bin, linking to ``first``
    # over that link, a value that reads back (glibc >= 2.32 stores links as pointer ^
    # (slot address >> 12)) as a pointer no chunk can have: 0x4141...41 is not 16-aligned
    link = ctypes.c_uint64(0x4141414141414141 ^ (second >> 12))
    ctypes.memmove(second, ctypes.byref(link), 8)
    libc.malloc(1000)  # ``second``; the bin's head is now the garbage
    libc.malloc(1000)
    return "no abort"


class Cycler:
    """Runs cycles on one learner group; new processes every ``respawn`` cycles (the group's
    process group and backend are rebuilt every cycle either way)."""

    def __init__(self, group_args: tuple, respawn: int, logs: Path) -> None:
        self.group_args, self.respawn, self.logs = group_args, respawn, logs
        self.group = None
        self.pids: list[int] = []
        self.age = 0  # cycles the group's processes have run

    def _start(self) -> None:
        import ray

        from rlsys.workers.learner import LearnerGroup

        if self.group is not None and self.age < self.respawn:  # same processes, new group
            cfg, _, model_dir, dtype, temperature = self.group_args
            workers = self.group.workers
            addr, port = ray.get(workers[0].address.remote())
            args = (addr, port, model_dir, dtype, cfg, temperature)
            ray.get([w.setup.remote(*args) for w in workers])
            return
        self.stop()
        self.group = LearnerGroup(*self.group_args)
        self.pids = ray.get([w.pid.remote() for w in self.group.workers])
        self.age = 0

    def stop(self) -> None:
        import ray

        if self.group is not None:
            for w in self.group.workers:
                ray.kill(w)
        self.group = None

    def cycle(self, n: int, batch, objective, out: Path) -> str | None:
        """One start/train/publish/save/teardown cycle; the phase a rank died in, or None."""
        import ray

        from rlsys.weight_sync.base import SyncAddress
        from rlsys.weight_sync.object_store import ObjectStoreTransport, decode

        phase, clock = "start", time.perf_counter()

        def enter(name: str) -> str:
            nonlocal clock
            now = time.perf_counter()
            SECONDS[phase] = SECONDS.get(phase, 0.0) + now - clock
            clock = now
            return name

        try:
            self._start()
            group = self.group
            phase = enter("train_step")
            group.train_step(batch, objective, seed=n, num_mini_batches=1, epochs=1)
            phase = enter("publish_weights")
            store = ObjectStoreTransport()
            ray.get(group.workers[0].connect_weight_sync.remote(store, 1, SyncAddress("", 0)))
            sent = ray.get(group.publish_weights(1, 1 << 20))[0]
            for ref in sent.handle:  # read as an engine does, then drop
                decode(ray.get(ref))
            del sent
            phase = enter("save_checkpoint")
            group.save_checkpoint(str(out / "checkpoint"))
            phase = enter("save_hf")
            group.save_hf(str(out / "hf"))
            phase = enter("shutdown")  # leave the process group, as Pools.shutdown does first
            ray.get([w.shutdown.remote() for w in group.workers], timeout=60)
            enter("")
            self.age += 1
            return None
        except Exception as exc:  # noqa: BLE001 - a dead rank: report it, go on
            print(f"cycle {n}: {phase} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            time.sleep(2.0)  # let the worker's log land
            for pid in self.pids:
                for line in worker_logs(self.logs, pid):
                    print(f"  pid {pid}: {line[:300]}", flush=True)
            self.stop()
            return phase
        finally:
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
    parser.add_argument(
        "--respawn-every", type=int, default=1, help="new rank processes every K cycles"
    )
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="first show that a write after free aborts a rank with these settings",
    )
    args = parser.parse_args()
    # before Ray and torch are imported: the burners are bare interpreters
    burners = [
        mp.Process(target=_burn, args=(args.nice,), daemon=True) for _ in range(args.burners)
    ]
    for b in burners:
        b.start()

    import ray

    from rlsys.algorithms.objectives import PolicyObjective
    from rlsys.config.learner import LearnerConfig, OptimConfig
    from rlsys.config.schema import ModelConfig
    from rlsys.models.loading import resolve_model_path
    from rlsys.placement import resources as placement
    from rlsys.placement.resources import ActorResources

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
        f"(nice {args.nice}), new rank processes every {args.respawn_every} cycle(s); "
        f"learner env {env or '{}'}; rlsys malloc tuning "
        f"{'off' if args.no_malloc_tuning else placement.MALLOC_ENV}",
        flush=True,
    )
    if args.self_test:  # what the settings catch in a process of the learners' kind
        actor = ray.remote(num_cpus=0)(_Probe).options(runtime_env=placement.thread_env(1))
        for test in ("overflow_by_one", "write_after_free"):
            probe = actor.remote()
            pid = ray.get(probe.pid.remote())
            try:
                answer = ray.get(getattr(probe, test).remote(), timeout=60)
                print(f"self-test {test}: {answer}", flush=True)
            except ray.exceptions.GetTimeoutError:
                print(f"self-test {test}: no answer in 60 s (the heap is broken)", flush=True)
            except ray.exceptions.RayError as exc:
                time.sleep(2.0)
                print(f"self-test {test}: the probe died ({type(exc).__name__})", flush=True)
                for line in worker_logs(logs, pid)[:2]:
                    print(f"  pid {pid}: {line[:300]}", flush=True)
            ray.kill(probe)
    cycler = Cycler(group_args, args.respawn_every, logs)
    started, aborts, done = time.perf_counter(), [], 0
    try:
        for n in range(1, args.cycles + 1):
            if args.max_seconds and time.perf_counter() - started > args.max_seconds:
                break
            phase = cycler.cycle(n, batch, objective, tmp / f"cycle{n}")
            if n == 1 and cycler.group is not None:  # the checks are really on in the ranks
                maps = ray.get(cycler.group.workers[0].__ray_call__.remote(lambda _: _maps()))
                print(f"rank 0 maps libc_malloc_debug: {'libc_malloc_debug' in maps}")
            done = n
            if phase is not None:
                aborts.append(f"{n}:{phase}")
            if n % 10 == 0:
                elapsed = time.perf_counter() - started
                print(f"{n} cycles, {len(aborts)} aborts, {elapsed:.0f} s", flush=True)
    finally:
        cycler.stop()
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
