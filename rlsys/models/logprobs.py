"""Token log-probabilities and entropies of a causal LM (shared by learner and reference).

Only the positions that are trained on need the lm-head: a batch is left-padded prompts then
responses, so those are the columns from the first response position on (``first_scored``).
The lm-head runs there only (``logits_to_keep``), and the log-probability of the sampled token
is ``logit - logsumexp(logits)`` instead of a full-vocabulary log-softmax. The head runs
``slice_tokens`` positions at a time (``learner.logits_chunk_tokens``;
``rlsys/models/lm_head.py``): each slice's logits are reduced to these numbers and dropped,
so no (B, T, V) logits or log-probabilities are materialised, nor kept for the backward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlsys.data.collate import position_ids
from rlsys.models.fused_logprobs import token_stats
from rlsys.models.lm_head import SliceFn, sliced_forward
from rlsys.models.vision import SUPPRESS_KEY

SUPPRESSED_LOGIT = -1e9  # a VL model's placeholder tokens: probability 0 at any temperature


def first_scored(loss_mask: torch.Tensor) -> int:
    """The first (B, T-1) column any row is trained on; 0 when no row has one (every position
    is then computed, as a dummy micro-batch must still run the whole model)."""
    columns = loss_mask.detach().ne(0).any(0).nonzero()
    return int(columns[0]) if len(columns) else 0


def _head_outputs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    first: int,
    vision: dict | None,
    fn: SliceFn,
    slice_tokens: int | None,
) -> torch.Tensor:
    """``fn`` of the next-token logits at positions ``first .. T-2``: (B, T-1-first, k).
    ``fn`` gets each slice's logits in the model's dtype with a VL model's placeholder tokens
    suppressed. ``vision``: a VL model's image inputs (``rlsys.models.vision.vision_inputs``);
    the model then derives its own (multimodal rotary) positions from the ids, images and
    mask, as it does generating."""
    vision = dict(vision or {})
    suppress = vision.pop(SUPPRESS_KEY, None)
    if suppress is not None and len(suppress):  # as the engine samples: see vision_token_ids
        fn = _suppressing(fn, suppress)
    positions = None if vision else position_ids(attention_mask)
    out = sliced_forward(
        model,
        fn,
        slice_tokens,
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=False,
        logits_to_keep=input_ids.shape[1] - first,
        **vision,
    )
    return out[:, :-1]  # the last position predicts past the sequence


def _suppressing(fn: SliceFn, suppress: torch.Tensor) -> SliceFn:
    """``fn`` of logits whose ``suppress`` tokens (a VL model's placeholders) are floored: a
    finite floor, not -inf: exp() of it is exactly 0 as for -inf, and the entropy's
    p * logits stays 0 without masking every text model's logits for infinities."""

    def suppressed(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        return fn(logits.index_fill(-1, suppress, SUPPRESSED_LOGIT), rows)

    return suppressed


def logprob_slices(
    targets: torch.Tensor, temperature: float, entropy: bool, with_grad: bool
) -> SliceFn:
    """The LM head's per-slice function for ``token_logprobs``: each position's log-probability
    of its target (``targets``, (n, 1), one per position the head computes) and, with
    ``entropy``, the entropy there (with a graph if ``with_grad``): (n, 1 or 2)."""

    def per_slice(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        # reduced in fp32 a block of rows at a time, with a backward of its own
        logp, ent = token_stats(logits, targets[rows], temperature, entropy, with_grad)
        return torch.stack([logp] if ent is None else [logp, ent], -1)

    return per_slice


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    first: int = 0,
    entropy: bool = False,
    entropy_grad: bool = False,
    vision: dict | None = None,
    slice_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log pi(x_{t+1} | x_{<=t}) at each position, (B, T-1), and the policy entropy there
    (``entropy``; else None).

    Logits are divided by the sampling temperature so that these match the distribution the
    engine sampled from (the behaviour policy). Positions before ``first`` (see
    ``first_scored``) are not computed and hold 0. The entropy is a metric without a graph
    unless ``entropy_grad`` (an entropy bonus in the loss). ``slice_tokens``: positions whose
    logits exist at once (None: all of them).
    """
    # the target of every computed position; the last one's (past the sequence) is dropped
    targets = F.pad(input_ids[:, first + 1 :], (0, 1)).reshape(-1, 1)
    with_grad = entropy_grad and torch.is_grad_enabled()
    per_slice = logprob_slices(targets, temperature, entropy, with_grad)
    stats = _head_outputs(model, input_ids, attention_mask, first, vision, per_slice, slice_tokens)
    logprobs = F.pad(stats[..., 0], (first, 0))
    if not entropy:
        return logprobs, None
    ent = stats[..., 1] if with_grad else stats[..., 1].detach()
    return logprobs, F.pad(ent, (first, 0))


def greedy_next_tokens(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vision: dict | None = None,
    slice_tokens: int | None = None,
) -> torch.Tensor:
    """The argmax next token after every prefix, (B, T-1): what greedy decoding would pick."""

    def argmax(logits: torch.Tensor, rows: slice) -> torch.Tensor:
        return logits.argmax(-1, keepdim=True)

    return _head_outputs(model, input_ids, attention_mask, 0, vision, argmax, slice_tokens)[..., 0]
