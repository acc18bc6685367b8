"""One trainable trajectory from a session's recorded calls.

The rule (docs/environments.md, "Agents written against the OpenAI API"):

* The trajectory is one call's prompt and generation, the *final* call, with the calls
  before it that it extends. Call j is extended by call k when k's prompt ids start with j's
  prompt ids and go on with at least the first of j's generated ids (the agent sent the
  conversation on, with j's reply in it).
* The final call is the one that extends the most earlier calls (ties: the latest), which
  is the last call of an agent that only ever appends to its conversation. Calls it does not
  extend (the agent rewrote or dropped history, asked a side question, retried) are left out
  and counted (``Episode.dropped_calls``).
* The response starts where the first kept call's prompt ends. A kept call's generated tokens
  are trained (mask 1, their behaviour logprobs and versions) as far as the final sequence
  reproduces them at the same positions; a token past the first difference was not generated
  in that context, so it and every other token after the first prompt (tool results, headers
  the template writes) are masked (mask 0, logprob 0, the preceding model token's version).
"""

from __future__ import annotations

from rlsys.agents.session import RecordedCall
from rlsys.types import Completion, Episode


def reproduced(call: RecordedCall, sequence: list[int]) -> int:
    """How many of ``call``'s generated tokens ``sequence`` holds right after its prompt
    (0 when its prompt is not a strict prefix of ``sequence``)."""
    p = len(call.prompt_ids)
    if len(sequence) <= p or sequence[:p] != call.prompt_ids:
        return 0
    n = 0
    for a, b in zip(call.token_ids, sequence[p:], strict=False):
        if a != b:
            break
        n += 1
    return n


def kept_calls(calls: list[RecordedCall], k: int) -> list[int]:
    """The calls before ``k`` that call ``k`` extends, in order."""
    final = calls[k].prompt_ids
    return [j for j in range(k) if reproduced(calls[j], final) > 0]


def stitch(calls: list[RecordedCall]) -> Completion:
    """The trajectory of a session's ``calls`` (at least one): its ``prompt_ids`` are the first
    kept call's prompt, ``episode.dropped_calls`` counts the calls left out."""
    if not calls:
        raise ValueError("stitch needs at least one recorded call")
    chains = [(len(kept_calls(calls, k)), k) for k in range(len(calls))]
    _, k = max(chains)  # most extended calls, then the latest
    kept = [*kept_calls(calls, k), k]
    final = calls[k]
    prompt = calls[kept[0]].prompt_ids
    sequence = final.prompt_ids + final.token_ids
    tokens = sequence[len(prompt) :]
    mask = [0] * len(tokens)
    logprobs = [0.0] * len(tokens)
    versions: list[int | None] = [None] * len(tokens)
    for j in kept:
        call = calls[j]
        start = len(call.prompt_ids) - len(prompt)
        for t in range(reproduced(call, sequence)):
            mask[start + t] = 1
            logprobs[start + t] = call.logprobs[t]
            versions[start + t] = call.versions[t]
    trained = [v for v in versions if v is not None]
    filled, last = [], trained[0] if trained else 0
    for v in versions:  # a masked token takes the version of the model token before it
        last = v if v is not None else last
        filled.append(last)
    episode = Episode(turns=len(kept), dropped_calls=len(calls) - len(kept))
    episode.truncated = final.finish_reason == "length"
    return Completion(
        tokens,
        logprobs,
        final.finish_reason,
        min(trained) if trained else 0,
        filled,
        mask,
        episode,
        prompt_ids=list(prompt),
    )
