"""The prompt feeder loop: prompts into requests, as fast as admission control allows."""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass

from rlsys.buffer.streaming import StreamingBuffer
from rlsys.data.sampler import PromptSampler
from rlsys.pipeline.loop import Loop
from rlsys.types import Prompt


@dataclass
class Request:
    """Prompts for one rollout worker call, tokenised."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]


class PromptFeeder(Loop):
    """Consumes: buffer reservations and the prompt sampler. Produces: ``Request``s of up to
    ``prompts_per_request`` prompts on ``requests``. Waits for: room in the buffer (admission
    control); unblocked by the learner taking a batch and finishing a step, or by groups being
    dropped. Ends (putting one ``None`` per rollout loop) when the buffer closes or the sample
    budget is spent."""

    name = "prompt-feeder"

    def __init__(
        self,
        buffer: StreamingBuffer,
        sampler: PromptSampler,
        encode: Callable[[list[Prompt]], tuple[list[Prompt], list[list[int]]]],
        requests: queue.Queue,
        prompts_per_request: int,
        on_failure,
    ) -> None:
        super().__init__(on_failure)
        self.buffer, self.sampler, self.encode = buffer, sampler, encode
        self.requests, self.per_request = requests, prompts_per_request
        self.drawn = 0  # prompts drawn so far

    def run(self) -> None:
        try:
            while granted := self.buffer.reserve(self.per_request):
                try:
                    with self.busy():
                        prompts = self.sampler.next_batch(granted)
                        self.drawn += granted
                        kept, ids = self.encode(prompts)
                except BaseException:
                    self.buffer.cancel(granted, "failed")
                    raise
                if len(kept) < granted:
                    self.buffer.cancel(granted - len(kept), "prompt_too_long")
                if kept:
                    self.requests.put(Request(kept, ids))
        finally:
            self.requests.put(None)
