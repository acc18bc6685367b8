"""Each position's log-probability of its target and the entropy there, from a slice of logits,
with a backward pass of its own.

Autograd through ``logits.float()``, ``logsumexp`` and ``gather`` keeps an fp32 copy of the
(n, V) logits for backward and makes several more (n, V) tensors there: the exponentials, their
product with the incoming gradient, the gather's scattered zeros, their sum and its cast back to
the logits' dtype. ``TokenStats`` computes the same numbers a block of rows at a time, keeps only
the logits as they came (bf16 under mixed precision) and three figures per row (the maximum of
z, the sum of exp(z - max), sum(p z)), and forms the gradient in one pass per block: for
z = logits / T, p = softmax(z), g the gradient of the log-probability of target t and h that
of the entropy H = lse - sum(p z),

    dL/dz = g (onehot(t) - p) + h p (sum(p z) - z),        dL/dlogits = dL/dz / T.

Probabilities are normalised by their sum, as ``torch.softmax`` does, not formed as
exp(z - lse): the rounding of the log-sum-exp would scale them all by up to an ulp of it, and
the entropy's sum(p z) with them. Values and gradients are within fp32 rounding of a float64
computation, as close as the autograd path was (tests/unit/test_fused_logprobs.py). On a
2-core CPU the log-probabilities of 1,850 positions over SmolLM2's 49k-token vocabulary took
0.23 s forward and backward against 1.10 s through autograd (bf16; `scripts/bench_head.py`,
docs/learners.md, "The head's own backward").
"""

from __future__ import annotations

import torch

# fp32 elements of one block's working tensors (rows per block = this // V, at least one):
# on a CPU about its cache (fastest of 2^18-2^22 on the EPYC, SmolLM2's vocabulary); on a
# GPU large, so that a slice of logits is a few blocks of kernels rather than hundreds
BLOCK_ELEMENTS = {"cpu": 1 << 20, "other": 1 << 24}


def _rows_per_block(logits: torch.Tensor, elements: int | None) -> int:
    if elements is None:
        elements = BLOCK_ELEMENTS["cpu" if logits.device.type == "cpu" else "other"]
    return max(1, elements // max(1, logits.shape[-1]))


def _scaled(block: torch.Tensor, temperature: float, out: torch.Tensor | None = None):
    """The block in fp32 divided by the temperature, in ``out`` (fp32, the block's shape) or
    a new tensor: never the logits' own storage (later steps work on it in place)."""
    z = block.to(torch.float32, copy=True) if out is None else out.copy_(block)
    return z.div_(temperature) if temperature != 1.0 else z


def _read_only(block: torch.Tensor, temperature: float) -> torch.Tensor:
    """z of the block for steps that only read it: fp32 logits at temperature 1 are z
    themselves (no copy of the block), else ``_scaled``."""
    if block.dtype == torch.float32 and temperature == 1.0:
        return block
    return _scaled(block, temperature)


def _softmax(z: torch.Tensor, peak: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """softmax(z) from its row maxima and sums of exp(z - max), in z's storage: normalised by
    the sum (as torch.softmax is) rather than through exp(z - lse), whose rounding of the
    log-sum-exp would scale every probability by up to one ulp of it."""
    return z.sub_(peak[:, None]).exp_().div_(total[:, None])


class TokenStats(torch.autograd.Function):
    """(log p(t), H) per row of ``logits`` (n, V) at ``temperature``; see the module docstring."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, entropy, elements):
        n = logits.shape[0]
        peak = logits.new_empty(n, dtype=torch.float32)  # row max of z
        total = torch.empty_like(peak)  # sum of exp(z - max)
        logp = torch.empty_like(peak)
        expected = torch.zeros_like(peak)  # sum(p z)
        step = _rows_per_block(logits, elements)
        for start in range(0, n, step):
            rows = slice(start, start + step)
            z = _read_only(logits[rows], temperature)
            peak[rows] = z.amax(-1)
            chosen = z.gather(-1, targets[rows]).squeeze(-1)
            e = (z - peak[rows, None]).exp_()
            total[rows] = e.sum(-1)
            logp[rows] = chosen - peak[rows] - total[rows].log()
            if entropy:
                expected[rows] = e.mul_(z).sum(-1).div_(total[rows])
        ctx.save_for_backward(logits, targets, peak, total, expected)
        ctx.temperature = temperature
        ctx.elements = elements
        ctx.set_materialize_grads(False)
        return logp, peak + total.log() - expected

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, peak, total, expected = ctx.saved_tensors
        grad = torch.empty_like(logits)
        # fp32 logits: each block's gradient is built in its own rows of grad, with no copy
        # into them at the end (bf16: built in fp32, then cast into grad)
        own = logits.dtype == torch.float32
        step = _rows_per_block(logits, ctx.elements)
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            z = _scaled(logits[rows], ctx.temperature, grad[rows] if own else None)
            spread = None if grad_entropy is None else torch.sub(expected[rows, None], z)
            p = _softmax(z, peak[rows], total[rows])  # in z's storage, as is all below
            if spread is None:  # no entropy term: the log-probability's alone
                p.mul_(-grad_logp[rows, None])
            else:  # p (h (E[z] - z) - g)
                spread.mul_(grad_entropy[rows, None])
                if grad_logp is not None:
                    spread.sub_(grad_logp[rows, None])
                p.mul_(spread)
            if grad_logp is not None:  # + g onehot(t)
                p.scatter_add_(-1, targets[rows], grad_logp[rows, None])
            if ctx.temperature != 1.0:
                p.div_(ctx.temperature)
            if not own:
                grad[rows] = p
        return grad, None, None, None, None


def token_stats(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    entropy: bool = True,
    entropy_grad: bool = False,
    elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(n,) log-probabilities of ``targets`` (n, 1) under softmax(``logits`` / ``temperature``)
    and, with ``entropy``, (n,) entropies (else None), reduced in fp32 whatever the logits'
    dtype; the entropy carries a gradient only with ``entropy_grad``. ``elements``: fp32
    elements a block of rows works on (None: ``BLOCK_ELEMENTS`` for the logits' device)."""
    logp, ent = TokenStats.apply(logits, targets, temperature, entropy, elements)
    if not entropy:
        return logp, None
    return logp, ent if entropy_grad else ent.detach()
