"""A decode loop whose batch shrinks as rows finish (the HF engine's, ``shrink_batch``).

transformers' ``generate`` decodes every row of a batch until the last one stops: a batch of
64 replies of ~13 tokens with one row that runs to its 48-token budget costs 48 full-width
decode steps, ~8 s of SmolLM2's ~11 s RL step on this project's 2-core CPU (most rows idle
for 35 of them). Here a row leaves the batch, its KV cache rows with it, once it ends (a stop
token, its own budget, or an abort), so the tail costs what its few live rows cost. Rows are
dropped in bunches (once an eighth of the batch has finished) because each drop copies the
cache; between drops each step writes its token into room the cache keeps for it
(``kv_cache.py``), where transformers' dynamic cache copies the whole cache every step.

Same tokens as ``generate`` under greedy decoding and the same per-token log-probabilities
(rounding aside); a sampled row draws from the same distribution, with different random
numbers (a step draws one per live row).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

# a sampler's pick: scores (B, V) -> chosen ids (B,), their log-probabilities (B,) and,
# when asked for, the (values, ids) of each row's most likely tokens, (B, k) each
Pick = Callable[
    [torch.Tensor], tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]
]


@dataclass
class Decoded:
    """Per input row: the new tokens (ending at a stop token or the budget), their
    log-probabilities, and the top alternatives per token (None unless asked for)."""

    tokens: list[list[int]]
    logprobs: list[list[float]]
    top: list[list[list[tuple[int, float]]]] | None


def shrinking_decode(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    budgets: list[int],
    pick: Pick,
    stop_ids: set[int],
    aborting: threading.Event,
    cache=None,
    forward_args: dict | None = None,
    *,
    in_place: bool,
) -> Decoded:
    """Decode left-padded prompts ``ids`` (B, W) with attention ``mask``, row i for at most
    ``budgets[i]`` tokens. ``cache``: a dynamic KV cache already holding every row's prompt
    but its last token (the engine's shared prefill); None prefills here. ``forward_args``:
    extra arguments of each forward (``logits_to_keep=1``). ``in_place``: the cache grows in
    place (``kv_cache.py``) rather than by transformers' concatenation."""
    from transformers import DynamicCache

    from rlsys.engines import kv_cache

    extra = forward_args or {}
    rows = len(ids)
    tokens: list[list[int]] = [[] for _ in range(rows)]
    logprobs: list[list[float]] = [[] for _ in range(rows)]
    top: list[list[list[tuple[int, float]]]] = [[] for _ in range(rows)]
    wants_top = False
    live = list(range(rows))  # the input row of each batch position
    finished = [False] * rows
    if cache is None:
        cache = DynamicCache(config=model.config)
        inputs, positions = ids, (mask.cumsum(-1) - 1).clamp(min=0)
    else:
        inputs, positions = ids[:, -1:], mask.sum(-1, keepdim=True) - 1
    if in_place:  # each step writes its token into room kept for it
        kv_cache.grow_in_place(cache, ids.shape[1] + max(budgets, default=0))
    for _ in range(max(budgets, default=0)):
        out = model(
            input_ids=inputs,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **extra,
        )
        chosen, logp, best = pick(out.logits[:, -1])
        aborted = aborting.is_set()
        picks, scores = chosen.tolist(), logp.tolist()
        if best is not None:
            wants_top = True
            best_logp, best_ids = best[0].tolist(), best[1].tolist()
        for j, row in enumerate(live):
            if finished[row]:  # ended at an earlier step, still in the batch
                continue
            tokens[row].append(picks[j])
            logprobs[row].append(scores[j])
            if best is not None:  # top-p leaves -inf outside its nucleus
                pairs = zip(best_ids[j], best_logp[j], strict=True)
                top[row].append([(t, v) for t, v in pairs if v != float("-inf")])
            finished[row] = aborted or picks[j] in stop_ids or len(tokens[row]) >= budgets[row]
        keep = [j for j, row in enumerate(live) if not finished[row]]
        if not keep:
            break
        if (len(live) - len(keep)) * 8 >= len(live):
            index = torch.tensor(keep, device=ids.device)
            cache.batch_select_indices(index)
            live = [live[j] for j in keep]
            mask, chosen = mask[index], chosen[index]
        mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
        inputs, positions = chosen[:, None], mask.sum(-1, keepdim=True) - 1
    return Decoded(tokens, logprobs, top if wants_top else None)
