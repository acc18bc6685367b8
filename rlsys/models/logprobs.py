"""Token log-probabilities and entropies of a causal LM (shared by learner and reference).

Only the positions that are trained on need the lm-head: a batch is left-padded prompts then
responses, so those are the columns from the first response position on (``first_scored``).
The lm-head runs there only (``logits_to_keep``), and the log-probability of the sampled token
is ``logit - logsumexp(logits)``, chunked over rows, instead of a full-vocabulary log-softmax:
no (B, T, V) log-probability tensor is materialised, and none is kept for the backward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlsys.data.collate import position_ids
from rlsys.models.vision import SUPPRESS_KEY

SUPPRESSED_LOGIT = -1e9  # a VL model's placeholder tokens: probability 0 at any temperature
CHUNK_BYTES = 64 << 20  # fp32 logits per chunk of rows in the log-sum-exp and entropy


def first_scored(loss_mask: torch.Tensor) -> int:
    """The first (B, T-1) column any row is trained on; 0 when no row has one (every position
    is then computed, as a dummy micro-batch must still run the whole model)."""
    columns = loss_mask.detach().ne(0).any(0).nonzero()
    return int(columns[0]) if len(columns) else 0


def _logits(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    first: int = 0,
    vision: dict | None = None,
) -> torch.Tensor:
    """Next-token logits at positions ``first .. T-2``: (B, T-1-first, V). ``vision``: a VL
    model's image inputs (``rlsys.models.vision.vision_inputs``); the model then derives its
    own (multimodal rotary) positions from the ids, images and mask, as it does generating."""
    vision = dict(vision or {})
    suppress = vision.pop(SUPPRESS_KEY, None)
    positions = None if vision else position_ids(attention_mask)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions,
        use_cache=False,
        logits_to_keep=input_ids.shape[1] - first,
        **vision,
    ).logits[:, :-1]
    if suppress is not None and len(suppress):  # as the engine samples: see vision_token_ids
        # a finite floor, not -inf: exp() of it is exactly 0 as for -inf, and the entropy's
        # p * logits stays 0 without masking every text model's logits for infinities
        logits = logits.index_fill(-1, suppress, SUPPRESSED_LOGIT)
    return logits


def _row_chunks(logits: torch.Tensor) -> int:
    """Rows per chunk: as many as fit ``CHUNK_BYTES``, at least one."""
    per_row = logits[0].numel() * logits.element_size() if len(logits) else 0
    return max(1, CHUNK_BYTES // max(per_row, 1))


def _entropy(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) given its log-sum-exp: lse - sum(p * logits)."""
    return lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)


def token_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    first: int = 0,
    entropy: bool = False,
    entropy_grad: bool = False,
    vision: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log pi(x_{t+1} | x_{<=t}) at each position, (B, T-1), and the policy entropy there
    (``entropy``; else None).

    Logits are divided by the sampling temperature so that these match the distribution the
    engine sampled from (the behaviour policy). Positions before ``first`` (see
    ``first_scored``) are not computed and hold 0. The entropy is a metric without a graph
    unless ``entropy_grad`` (an entropy bonus in the loss), which keeps a (B, T, V)
    probability tensor for the backward pass.
    """
    logits = _logits(model, input_ids, attention_mask, first, vision).float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, first + 1 :].unsqueeze(-1)
    chosen = logits.gather(-1, targets).squeeze(-1)
    step = _row_chunks(logits)
    lse = torch.cat([torch.logsumexp(c, dim=-1) for c in logits.split(step)])
    logprobs = F.pad(chosen - lse, (first, 0))
    if not entropy:
        return logprobs, None
    if entropy_grad and torch.is_grad_enabled():
        ent = _entropy(logits, lse)
    else:
        with torch.no_grad():
            ent = torch.cat(
                [_entropy(c, s) for c, s in zip(logits.split(step), lse.split(step), strict=True)]
            )
    return logprobs, F.pad(ent, (first, 0))


def greedy_next_tokens(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, vision: dict | None = None
) -> torch.Tensor:
    """The argmax next token after every prefix, (B, T-1): what greedy decoding would pick."""
    return _logits(model, input_ids, attention_mask, 0, vision).argmax(-1)
