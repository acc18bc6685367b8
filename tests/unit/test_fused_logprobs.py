"""TokenStats (the LM head's log-probabilities and entropies with a backward of its own) gives
a float64 autograd computation's values and gradients to fp32 rounding, block by block, from
fp32 and bf16 logits."""

from __future__ import annotations

import pytest
import torch

from rlsys.models.fused_logprobs import token_stats


def _reference(logits, targets, temperature, entropy_grad):
    """The head's figures through autograd in float64: what both fp32 paths approximate."""
    z = logits.double() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets).squeeze(-1) - lse
    with torch.set_grad_enabled(entropy_grad):
        entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return logp, entropy


def _run(fn, logits, targets, temperature, entropy_grad, g, h):
    x = logits.clone().requires_grad_()
    logp, entropy = fn(x, targets, temperature, entropy_grad)
    loss = (logp * g).sum() + ((entropy * h).sum() if entropy_grad else 0.0)
    loss.backward()
    return logp.detach().double(), entropy.detach().double(), x.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_values_and_gradients_match_float64(dtype, temperature, entropy_grad):
    """Within fp32 rounding of a float64 autograd computation (the fp32 autograd path this
    replaced is 5e-6 off it here), the gradient rounded once to the logits' dtype."""
    torch.manual_seed(0)
    n, vocab = 37, 300  # 37 rows in blocks of 6: several blocks and a remainder
    logits = (torch.randn(n, vocab) * 4).to(dtype)
    targets = torch.randint(0, vocab, (n, 1))
    g, h = torch.randn(n), torch.randn(n)

    def fused(x, t, temp, eg):
        return token_stats(x, t, temp, entropy=True, entropy_grad=eg, elements=6 * vocab)

    want = _run(_reference, logits, targets, temperature, entropy_grad, g.double(), h.double())
    got = _run(fused, logits, targets, temperature, entropy_grad, g, h)
    torch.testing.assert_close(got[0], want[0], atol=5e-6, rtol=0)  # log-probabilities
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)  # entropies
    assert got[2].dtype == dtype  # the gradient comes back in the logits' dtype
    expected = want[2].to(dtype).double()
    rtol = 1e-5 if dtype == torch.float32 else 2**-8  # bf16: one rounding apart at most
    torch.testing.assert_close(got[2].double(), expected, atol=1e-5, rtol=rtol)


def test_without_entropy_or_gradients():
    torch.manual_seed(1)
    logits = torch.randn(5, 50, requires_grad=True)
    targets = torch.randint(0, 50, (5, 1))
    logp, entropy = token_stats(logits, targets, entropy=False)
    assert entropy is None
    want = torch.log_softmax(logits, -1).gather(-1, targets).squeeze(-1)
    torch.testing.assert_close(logp, want)
    with torch.no_grad():
        logp, entropy = token_stats(logits, targets)
    assert not logp.requires_grad and not entropy.requires_grad
    _, entropy = token_stats(logits, targets)
    assert not entropy.requires_grad  # a metric unless entropy_grad
    # nothing scored (a packed micro-batch with no trained token): empty, and a zero gradient
    empty = torch.zeros(0, 50, requires_grad=True)
    logp, _ = token_stats(empty, torch.zeros(0, 1, dtype=torch.long))
    logp.sum().backward()
    assert logp.shape == (0,) and empty.grad.shape == (0, 50)


def test_backward_keeps_the_logits_as_they_came():
    """The saved tensors are the bf16 logits and per-row figures: no fp32 (n, V) copy."""
    logits = torch.randn(8, 1000, dtype=torch.bfloat16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, _ = token_stats(logits, torch.zeros(8, 1, dtype=torch.long))
    assert max(t.numel() * t.element_size() for t in saved) == 8 * 1000 * 2


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_fp32_logits_read_in_place_stay_as_they_came(entropy_grad):
    """At temperature 1 fp32 logits are read in place and their gradient is built in grad's
    own rows: strided logits (a slice of wider ones, a transposed layout) give what contiguous
    ones give, and no logit changes through forward and backward."""
    torch.manual_seed(2)
    n, vocab = 13, 200
    base = torch.randn(n, vocab) * 3
    targets = torch.randint(0, vocab, (n, 1))
    g, h = torch.randn(n), torch.randn(n)

    def fused(x, t, temp, eg):
        return token_stats(x, t, temp, entropy=True, entropy_grad=eg, elements=4 * vocab)

    def run(logits):
        before = logits.detach().clone()
        logp, entropy = fused(logits, targets, 1.0, entropy_grad)
        loss = (logp * g).sum() + ((entropy * h).sum() if entropy_grad else 0.0)
        grad = torch.autograd.grad(loss, logits)[0]
        assert torch.equal(logits.detach(), before)  # the logits as they came
        return logp.detach(), entropy.detach(), grad

    want = run(base.clone().requires_grad_())
    wide = torch.cat([base, torch.randn(n, 7)], 1).requires_grad_()
    transposed = base.t().contiguous().t().requires_grad_()
    for logits in (wide[:, :vocab], transposed):
        assert not logits.is_contiguous()
        for a, b in zip(run(logits), want, strict=True):
            # a strided row sums in another order: within fp32 rounding, as against float64
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
