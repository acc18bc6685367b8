"""The HF engine's prompt layout and its prefill with each shared token computed once
(``rollout.engine_args.share_prefill``).

A micro-batch's rows share prompt tokens two ways: the ``n`` samples of a prompt (adjacent
rows) share the whole prompt, and distinct prompts often share a head, a chat template's
system turn above all: 27 of the 51-53 tokens of every ``task=arithmetic_chat`` prompt for
SmolLM2 (the instruction after the question sits at a different position in each, so it is
not shared), so an evaluation of 200 prompts prefilled 10,561 tokens where ~5,000 differ.
Here the common head is prefilled once in one row, each distinct prompt's remainder (but its
last token) once in a row that starts from a copy of the head's KV cache, and that cache is
copied to each of the prompt's rows; decoding starts from the last prompt token.

The rows lie as ``[common head | remainder, left-padded]``: the padding sits between the head
and the remainder, masked, and position ids count real tokens only, so every row attends to
and is positioned as its prompt left-padded would be. With no common head this is plain left
padding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import DynamicCache


def common_head(prompts: list[list[int]]) -> int:
    """How many leading tokens all ``prompts`` share, leaving each at least its last token."""
    if not prompts:
        return 0
    first, last = min(prompts), max(prompts)  # every prompt's head is theirs (lexical order)
    limit, head = min(len(p) for p in prompts) - 1, 0
    while head < limit and first[head] == last[head]:
        head += 1
    return head


def lay_out(
    prompts: list[list[int]], pad_id: int, head: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each (rows, head + longest remainder): the first ``head`` tokens
    (shared by every prompt) in place, each prompt's remainder left-padded after them."""
    width = max(len(p) for p in prompts) - head
    ids = torch.full((len(prompts), head + width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    if head:
        ids[:, :head] = torch.tensor(prompts[0][:head])
        mask[:, :head] = 1
    for i, p in enumerate(prompts):
        start = ids.shape[1] - (len(p) - head)  # the remainder ends at the last column
        ids[i, start:] = torch.tensor(p[head:])
        mask[i, start:] = 1
    return ids, mask


def shared_prefill(
    model: torch.nn.Module,
    prompts: list[list[int]],
    pad_id: int,
    device: torch.device,
    forward_args: dict,
) -> tuple[torch.Tensor, torch.Tensor, DynamicCache | None]:
    """(ids, mask, cache): the rows of ``prompts`` laid out around their common head and a
    transformers dynamic KV cache holding every row's prompt but its last token, each shared
    token computed once (see the module docstring); cache None, with plain left padding, when
    the rows share nothing or the prompts are one token. ``forward_args``: extra arguments of
    each forward (``logits_to_keep=1``: the logits go unused)."""
    starts = [i == 0 or p != prompts[i - 1] for i, p in enumerate(prompts)]
    first = [i for i, start in enumerate(starts) if start]
    head = common_head([prompts[i] for i in first])
    ids, mask = lay_out(prompts, pad_id, head)
    if (head == 0 and len(first) == len(prompts)) or ids.shape[1] < 2:
        return ids, mask, None
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)

    if head:  # one row; every distinct prompt's row starts from a copy of it
        model(
            input_ids=ids[:1, :head].to(device),
            attention_mask=mask[:1, :head].to(device),
            position_ids=torch.arange(head, device=device)[None],
            past_key_values=cache,
            use_cache=True,
            **forward_args,
        )
        cache.batch_select_indices(torch.zeros(len(first), dtype=torch.long, device=device))
    if ids.shape[1] - head > 1:  # the distinct remainders but their last tokens
        seen = mask[first, :-1]  # each attends to the head and its own tokens
        model(
            input_ids=ids[first, head:-1].to(device),
            attention_mask=seen.to(device),
            position_ids=(seen.cumsum(-1) - 1).clamp(min=0)[:, head:].to(device),
            past_key_values=cache,
            use_cache=True,
            **forward_args,
        )
    owner = torch.tensor(starts).cumsum(0) - 1  # row -> its prompt's prefilled row
    cache.batch_select_indices(owner.to(device))
    return ids, mask, cache
