"""What a rollout engine is: the interface ``RolloutWorker`` drives and every engine offers.

An engine is built as ``ENGINES.get(name)(model_path, dtype, rollout_cfg, device)`` (plus its
settings, if it registered any: ``rlsys.engines.build_engine``) inside a rollout worker's process and is called from one thread of that worker (``abort`` from any).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from rlsys.types import Completion, SamplingParams

if TYPE_CHECKING:  # the config imports the engine registry: no torch here
    from rlsys.weight_sync.base import Bucket


WAKE_ALL = ("weights", "kv_cache")  # what ``wake`` brings back by default


@runtime_checkable
class RolloutEngine(Protocol):
    """Sampling with behaviour log-probabilities, in-place weight updates, and the calls a
    colocated or partial-rollout run needs."""

    version: int  # the policy version of the weights loaded last (0: the starting weights)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        budgets: list[int] | None = None,
        images: list | None = None,
    ) -> list[list[Completion]]:
        """``sampling.n`` completions per prompt (token ids in, token ids and each token's
        behaviour log-probability out); prompt i gets at most ``budgets[i]`` new tokens
        (default ``sampling.max_new_tokens``) and, for a vision-language model, shows
        ``images[i]`` (its ``PromptPixels``, whose placeholder tokens are in its ids; None:
        no images; an engine that cannot show images raises ValueError naming the fix). After ``abort``, unfinished sequences end with
        ``finish_reason="abort"`` and what they produced so far."""
        ...

    def update_weights(self, buckets: Iterable[Bucket], version: int, adopt: bool = False) -> int:
        """Load full tensors by Hugging Face name, bucket by bucket, and become ``version``;
        returns the number of tensors loaded. A name the model lacks raises ``KeyError``.
        ``adopt``: the tensors stay valid until the next update (a resident transport), so
        the engine keeps them as its weights instead of copying; asked only of an engine
        whose ``view_dtype`` is not None."""
        ...

    def view_dtype(self) -> str | None:
        """The dtype of the weights, where this engine can keep received tensors as its
        weights (``update_weights(adopt=True)``); None where it must copy them in."""
        ...

    def sleep(self) -> int:
        """Free the memory the engine's weights (and KV cache) hold while the learners train
        (colocated placement); returns the bytes freed (0 where the engine cannot)."""
        ...

    def wake(self, tags: tuple[str, ...] = WAKE_ALL) -> None:
        """Undo ``sleep`` for ``tags``: "weights" (the version loaded last is back, ready to
        take a weight sync) and "kv_cache" (room to generate again). A colocated step wakes
        the weights, syncs, then wakes the KV cache, so the sync never competes with it for
        memory; engines with no separate KV cache ignore "kv_cache"."""
        ...

    def abort(self) -> None:
        """Make the running ``generate`` return soon (safe from another thread)."""
        ...
