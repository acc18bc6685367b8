"""The LM head's log-probabilities and entropies, forward and backward: autograd against
``TokenStats`` (rlsys/models/fused_logprobs.py), side by side.

    python scripts/bench_head.py [--positions 1850] [--vocab 49152] [--dtype bfloat16]
        [--temperature 1.0] [--entropy-grad] [--rounds 5] [--threads N]

Random logits (n positions x V, in ``--dtype``, as the head returns them under mixed
precision) and targets; each round times both paths once, in turns, forward then backward of
a weighted sum of the log-probabilities (and of the entropies with ``--entropy-grad``; else
the entropy is a metric without a graph, as in training). Prints each path's seconds per
round, their medians and the ratio, and the largest difference between the two paths'
log-probabilities and gradients. The defaults are the long-generation peer workload's head
(16 replies of about 115 tokens, SmolLM2's vocabulary). The CPU line comes first.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def autograd_path(logits, targets, temperature, entropy_grad):
    """The head's function before TokenStats: fp32 log-sum-exp and gather under autograd."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets).squeeze(-1) - lse
    with torch.set_grad_enabled(entropy_grad):
        entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy


def fused_path(logits, targets, temperature, entropy_grad):
    from rlsys.models.fused_logprobs import token_stats

    return token_stats(logits, targets, temperature, entropy=True, entropy_grad=entropy_grad)


def _timed(path, logits, targets, args, g, h):
    x = logits.clone().requires_grad_()
    start = time.perf_counter()
    logp, entropy = path(x, targets, args.temperature, args.entropy_grad)
    loss = (logp * g).sum() + ((entropy * h).sum() if args.entropy_grad else 0.0)
    loss.backward()
    return time.perf_counter() - start, logp.detach(), x.grad


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--positions", type=int, default=1850)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--entropy-grad", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (all cores)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from rlsys.perf.machine import cpu_info

    print(cpu_info().line(), f"torch threads {torch.get_num_threads()}", flush=True)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    logits = (torch.randn(args.positions, args.vocab) * 3).to(dtype)
    targets = torch.randint(0, args.vocab, (args.positions, 1))
    g, h = torch.randn(args.positions), torch.randn(args.positions)
    paths = {"autograd": autograd_path, "fused": fused_path}
    seconds: dict[str, list[float]] = {name: [] for name in paths}
    for path in paths.values():  # one warm-up call each
        _timed(path, logits, targets, args, g, h)
    out = {}
    for i in range(args.rounds):
        order = list(paths) if i % 2 == 0 else list(reversed(paths))
        for name in order:
            s, logp, grad = _timed(paths[name], logits, targets, args, g, h)
            seconds[name].append(s)
            out[name] = (logp, grad)
    for name, values in seconds.items():
        rounds = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name:9s} {statistics.median(values):.3f} s  (rounds: {rounds})")
    ratio = statistics.median(seconds["autograd"]) / statistics.median(seconds["fused"])
    logp_diff = (out["fused"][0] - out["autograd"][0]).abs().max().item()
    grad_diff = (out["fused"][1].float() - out["autograd"][1].float()).abs().max().item()
    print(
        f"fused / autograd speed {ratio:.2f}x; {args.positions} x {args.vocab} {args.dtype}, "
        f"max |difference|: log-probabilities {logp_diff:.2e}, gradients {grad_diff:.2e}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
