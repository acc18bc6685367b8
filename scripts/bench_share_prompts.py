"""The learner's train step unpacked, packed, packed with shared prompts, and also skipping
inert rows, side by side.

    python scripts/bench_share_prompts.py [--model smollm2-135m] [--task arithmetic_chat]
        [--precision bf16] [--prompts 4] [--samples 8] [--reply 16] [--tied 0] [--rounds 4]

One process, one learner rank on every core (``learner.world_size=1``), the same weights in
four backends: ``unpacked`` (``learner.packing=false``), ``packed`` (``learner.packing=true
learner.share_prompts=false``), ``shared`` (both true) and ``skipped`` (``shared`` with
``learner.skip_zero_advantage=true``; the others false). The batch is the task's first
``--prompts`` training prompts, rendered as rlsys sends them, each with ``--samples`` random
replies of ``--reply / 2`` to ``--reply`` tokens (GRPO's layout: a group's rows repeat its
prompt), random advantages but for the last ``--tied`` groups, whose advantages are 0 (tied
rewards), one PPO-clip step (token mean) on one micro-batch. Each round runs the four in
turn (the order rotates, so drift falls on all); the first round is warm-up. It prints each
one's seconds per round, the median, the loss and grad norm of the first round (the loss of
``skipped`` averages over the rows it trains; the grad norms agree up to float rounding)
and the load average: on 2 cores a load above ~2 means something else shared them. The CPU
line (model, AMX) comes first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

VARIANTS = {  # learner.packing, share_prompts, skip_zero_advantage
    "unpacked": (False, False, False),
    "packed": (True, False, False),
    "shared": (True, True, False),
    "skipped": (True, True, True),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a conf/model preset")
    parser.add_argument("--task", default="arithmetic_chat", help="a conf/task preset")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--reply", type=int, default=16, help="longest reply, tokens")
    parser.add_argument("--tied", type=int, default=0, help="groups of advantage 0, the last")
    parser.add_argument("--rounds", type=int, default=4, help="the first is warm-up")
    args = parser.parse_args()
    if args.rounds < 2 or min(args.prompts, args.samples, args.reply) < 1:
        parser.error("--rounds must be >= 2 and --prompts, --samples, --reply >= 1")
    if not 0 <= args.tied <= args.prompts:
        parser.error(f"--tied={args.tied} must be between 0 and --prompts={args.prompts}")

    import numpy as np
    import torch
    import torch.distributed as dist

    from rlsys.algorithms.objectives import PolicyObjective
    from rlsys.algorithms.policy_losses import ClipSettings
    from rlsys.backends import build_backend
    from rlsys.config.learner import LearnerConfig, OptimConfig
    from rlsys.data.collate import pack
    from rlsys.data.tasks import load_task
    from rlsys.models.loading import load_tokenizer, resolve_model_path
    from rlsys.perf.machine import cpu_info
    from rlsys.resolve import load_config
    from rlsys.trainers.collector import RolloutCollector

    print(cpu_info().line(), flush=True)
    torch.set_num_threads(cpu_info().cores)
    store = tempfile.mkdtemp(prefix="rlsys-bench-share-")
    dist.init_process_group("gloo", init_method=f"file://{store}/store", rank=0, world_size=1)
    cfg = load_config([f"model={args.model}", f"task={args.task}"])
    path = resolve_model_path(cfg.model)
    tok = load_tokenizer(path)
    collector = RolloutCollector.for_task(None, tok, cfg.task, cfg.reward)
    prompts = collector.encode(load_task(cfg.task, 0).train[: args.prompts])[1]
    rng = np.random.default_rng(0)
    rows = [p for p in prompts for _ in range(args.samples)]
    lengths = rng.integers(max(1, args.reply // 2), args.reply + 1, len(rows))
    replies = [rng.integers(100, len(tok) - 1, n).tolist() for n in lengths]
    batch = pack(rows, replies, tok.pad_token_id)
    batch.old_logprobs = np.zeros_like(batch.loss_mask) - 3.0
    advantages = rng.standard_normal(len(rows)).astype(np.float32)
    advantages[len(rows) - args.tied * args.samples :] = 0.0
    batch.advantages = advantages[:, None] * batch.loss_mask
    objective = PolicyObjective(loss_settings=ClipSettings(), loss_agg="token_mean")
    print(
        f"batch {batch.input_ids.shape[0]} rows x {batch.input_ids.shape[1]} tokens, "
        f"prompts of {sorted({len(p) for p in prompts})} tokens, {args.precision}, "
        f"{args.tied} of {args.prompts} groups tied"
    )
    backends = {}
    for name, (packing, share, skip) in VARIANTS.items():
        learner = LearnerConfig(
            world_size=1,
            micro_batch_size=len(rows),
            max_tokens_per_micro_batch=None,
            packing=packing,
            share_prompts=share,
            skip_zero_advantage=skip,
            mixed_precision="bfloat16" if args.precision == "bf16" else None,
            optim=OptimConfig(lr=1e-6, warmup_steps=0),
        )
        backends[name] = build_backend(learner, path, "float32", 1.0, torch.device("cpu"))
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for round_ in range(args.rounds):
        load = os.getloadavg()[0]
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            start = time.perf_counter()
            metrics = backends[name].train_step(batch, objective, 1, 1, seed=0)
            took = time.perf_counter() - start
            if round_:
                seconds[name].append(took)
            else:
                loss, norm = metrics.get("loss", float("nan")), metrics["grad_norm"]
                print(f"  warm-up {name}: {took:.2f} s, loss {loss:.6f}, grad norm {norm:.6f}")
        print(f"  round {round_}: load before {load:.1f}", flush=True)
    base = statistics.median(seconds["unpacked"])
    for name, values in seconds.items():
        median = statistics.median(values)
        rounds = ", ".join(f"{v:.2f}" for v in values)
        print(f"{name:9s} {median:6.2f} s  unpacked / this {base / median:.2f}x  ({rounds})")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
