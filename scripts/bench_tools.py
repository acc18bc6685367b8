"""Multi-turn rollouts against a slow tool: lock-step turns vs per-trajectory async turns.

    python scripts/bench_tools.py [--prompts 8] [--n 2] [--turns 3] [--latency 0.2]
        [--jitter 0.05] [--tail-p 0] [--tail-s 1.0] [--rounds 3] [--modes lockstep,lockstep_parallel,async]
        [--engine hf] [--json out.json] [key=value ...]

One real rollout worker (a Ray actor holding the ``--engine`` engine on the tiny model,
``rollout.num_cpus_per_worker`` threads) generates the same batch (``--prompts`` prompts of
``task=guess_number``, ``--n`` trajectories each) through the ``latency`` environment
(``rlsys/envs/latency.py``: every turn is a tool call sleeping ``--latency`` s +- ``--jitter``,
seeded per trajectory and turn, so every mode waits for the same tool latencies; with
``--tail-p`` a call is a straggler taking ``--tail-s`` with that probability; a
trajectory ends after ``--turns`` calls or when the model ends its reply) once per mode:

* ``lockstep``: ``task.env.scheduling=lockstep``, ``max_concurrent_steps=1``: one call for all
  live trajectories' next turns, after every tool of the turn ran, one after the other (the
  scheduling before asynchronous turns).
* ``lockstep_parallel``: lock-step turns, the tools of one turn at once.
* ``async``: ``task.env.scheduling=async``: each trajectory's next turn goes out with the next
  call after its tool returned; tools overlap each other and generation.

Each mode runs one untimed round, then ``--rounds`` timed ones (their seeds differ; the same
seeds in every mode). Prints trajectories/s per mode and its ratio to ``lockstep``, with the
generation calls, the mean trajectories per call, turns per trajectory, the share of tool
time that overlapped generation, and the prompt tokens the engine's prefix cache served
(vLLM; the HF engine prefills every prompt). ``--json PATH`` writes the records. Extra
``key=value`` overrides go to the config (``task.*``, ``rollout.*``, ``model=...``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import numpy as np

from rlsys.run.bench import write_records

MODES = {  # mode -> task.env overrides
    "lockstep": {"scheduling": "lockstep", "max_concurrent_steps": 1},
    "lockstep_parallel": {"scheduling": "lockstep"},
    "async": {"scheduling": "async"},
}


class Counted:
    """A ``complete`` on one rollout worker that counts calls, trajectories and prompt
    tokens (each call seeded on its own, as a rollout loop does)."""

    def __init__(self, pool, seed: int) -> None:
        self.pool, self.seed = pool, seed
        self.calls = self.sequences = self.prompt_tokens = 0

    def __call__(self, prompt_ids, sampling, budgets):
        self.calls += 1
        self.sequences += len(prompt_ids)
        self.prompt_tokens += sum(len(p) for p in prompt_ids) * sampling.n
        return self.pool.generate_on(0, prompt_ids, sampling, self.seed + self.calls, budgets)


def run_mode(mode: str, args, cfg, pool, tokenizer, prompts, prompt_ids, worker) -> dict:
    """The warm-up round and ``args.rounds`` timed rounds of ``mode``; its record."""
    import ray

    from rlsys.envs.latency import Latency, LatencySettings
    from rlsys.envs.rollout import EpisodeRunner
    from rlsys.types import SamplingParams

    env_cfg = dataclasses.replace(
        cfg.task.env,
        max_turns=args.turns,
        **{"max_concurrent_steps": len(prompts) * args.n, **MODES[mode]},
    )
    sampling = SamplingParams(
        n=args.n, temperature=cfg.rollout.temperature, max_new_tokens=cfg.task.max_new_tokens
    )
    walls, counts, episodes = [], [], []
    cached = 0
    for round_ in range(args.rounds + 1):
        factory = Latency(
            settings=LatencySettings(
                latency_s=args.latency,
                jitter_s=args.jitter,
                turns=args.turns,
                seed=round_,
                tail_p=args.tail_p,
                tail_s=args.tail_s,
            )
        )
        runner = EpisodeRunner(factory, tokenizer, env_cfg)
        complete = Counted(pool, seed=1000 * round_)
        before = ray.get(worker.cached_prompt_tokens.remote())
        started = time.perf_counter()
        out = runner.run(prompts, prompt_ids, sampling, complete)
        wall = time.perf_counter() - started
        if round_ == 0:
            continue  # warm-up
        cached += ray.get(worker.cached_prompt_tokens.remote()) - before
        walls.append(wall)
        counts.append(complete)
        episodes += [c.episode for group in out for c in group]
    trajectories = len(prompts) * args.n * args.rounds
    calls = sum(c.calls for c in counts)
    tool_s = sum(e.tool_s for e in episodes)
    prompt_tokens = sum(c.prompt_tokens for c in counts)
    return {
        "mode": mode,
        "engine": cfg.rollout.engine,
        "trajectories": trajectories,
        "wall_s": float(sum(walls)),
        "trajectories_per_s": trajectories / sum(walls),
        "generation_calls": calls,
        "trajectories_per_call": sum(c.sequences for c in counts) / calls,
        "turns_mean": float(np.mean([e.turns for e in episodes])),
        "tool_s_mean": tool_s / sum(e.turns for e in episodes),
        "tool_overlap_frac": sum(e.tool_overlap_s for e in episodes) / tool_s,
        "tool_timeouts": sum(e.tool_timeouts for e in episodes),
        "prompt_tokens": prompt_tokens,
        "cached_prompt_tokens": cached,
        "cached_prompt_frac": cached / prompt_tokens if prompt_tokens else 0.0,
        "prompts": len(prompts),
        "n": args.n,
        "turns": args.turns,
        "latency_s": args.latency,
        "jitter_s": args.jitter,
        "tail_p": args.tail_p,
        "tail_s": args.tail_s,
        "batch_wait_s": env_cfg.batch_wait_s,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=2, help="trajectories per prompt")
    parser.add_argument("--turns", type=int, default=3, help="tool calls per trajectory")
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per tool call")
    parser.add_argument("--jitter", type=float, default=0.05, help="+- seconds, uniform")
    parser.add_argument("--tail-p", type=float, default=0.0, help="straggler probability")
    parser.add_argument("--tail-s", type=float, default=1.0, help="a straggler's seconds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--engine", default="hf", help="rollout.engine: hf | vllm")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}; pick from {list(MODES)}")

    import ray

    from rlsys.data.tasks import load_task
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.placement.resources import ActorResources
    from rlsys.resolve import load_config
    from rlsys.runtime import quiet_libraries
    from rlsys.trainers.collector import RolloutCollector
    from rlsys.workers.rollout import RolloutPool

    quiet_libraries()
    cfg = load_config(
        [
            "task=guess_number",
            f"rollout.engine={args.engine}",
            "rollout.num_workers=1",
            *args.overrides,
        ]
    )
    path = resolve_model_path(cfg.model)
    tokenizer = load_tokenizer(path)
    task = load_task(cfg.task, cfg.run.seed)
    prompts, prompt_ids = RolloutCollector.for_task(None, tokenizer, cfg.task).encode(
        task.train[: args.prompts]
    )
    threads = int(cfg.rollout.num_cpus_per_worker or 1)
    ray.init(num_cpus=max(threads, 1), include_dashboard=False, log_to_driver=False)
    pool = RolloutPool(cfg.rollout, ActorResources(threads, 0.0, threads), path, cfg.model.dtype)
    records = []
    try:
        print(
            f"{'mode':<19}{'traj/s':>8}{'vs first':>13}{'calls':>7}{'traj/call':>11}"
            f"{'turns':>7}{'tool s':>8}{'overlap':>9}{'cached':>8}"
        )
        for mode in modes:
            record = run_mode(
                mode, args, cfg, pool, tokenizer, prompts, prompt_ids, pool.workers[0]
            )
            base = records[0]["trajectories_per_s"] if records else record["trajectories_per_s"]
            record["speedup_vs_first"] = record["trajectories_per_s"] / base
            records.append(record)
            print(
                f"{mode:<19}{record['trajectories_per_s']:>8.2f}"
                f"{record['speedup_vs_first']:>12.2f}x{record['generation_calls']:>7}"
                f"{record['trajectories_per_call']:>11.1f}{record['turns_mean']:>7.2f}"
                f"{record['tool_s_mean']:>8.3f}{record['tool_overlap_frac']:>9.2f}"
                f"{record['cached_prompt_frac']:>8.2f}",
                flush=True,
            )
    finally:
        pool.shutdown()
        ray.shutdown()
    write_records(args.json_path, records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
