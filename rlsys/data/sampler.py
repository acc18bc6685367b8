"""Prompt samplers: by epoch (``PromptSampler``) or by a curriculum (``rlsys.data.curriculum``),
built from ``data.sampler`` by ``make_sampler``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlsys.types import Prompt, RolloutGroup

if TYPE_CHECKING:
    from rlsys.config.data import DataConfig
    from rlsys.data.curriculum import CurriculumSampler


class PromptSampler:
    """Yields batches of prompts; reshuffles each epoch (deterministic in the seed)."""

    def __init__(self, prompts: list[Prompt], batch_size: int, shuffle: bool, seed: int) -> None:
        if not prompts:
            raise ValueError("the task's train split is empty; check task.* settings")
        self.prompts, self.batch_size, self.shuffle, self.seed = prompts, batch_size, shuffle, seed
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> np.ndarray:
        n = len(self.prompts)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, self.epoch]).permutation(n)

    def next_batch(self, size: int | None = None) -> list[Prompt]:
        """The next ``size`` (default ``batch_size``) prompts, wrapping into a new epoch as
        needed."""
        size = size or self.batch_size
        batch = []
        while len(batch) < size:
            if self.position >= len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            take = self._order[self.position : self.position + size - len(batch)]
            batch.extend(self.prompts[i] for i in take)
            self.position += len(take)
        return batch

    def observe(self, groups: list[RolloutGroup]) -> None:
        """Scored groups: the order of an epoch does not depend on them."""

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if "epoch" not in state:
            raise ValueError(
                "the checkpoint's prompt sampler is the curriculum but data.sampler=uniform; "
                "resume with data.sampler=curriculum or start a new run"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()


def make_sampler(
    cfg: DataConfig, prompts: list[Prompt], n_samples: int, seed: int
) -> PromptSampler | CurriculumSampler:
    """The training prompts' sampler that ``data.sampler`` names."""
    if cfg.sampler == "curriculum":
        from rlsys.data.curriculum import CurriculumSampler

        return CurriculumSampler(prompts, cfg.batch_size, n_samples, cfg.curriculum, seed)
    return PromptSampler(prompts, cfg.batch_size, cfg.shuffle, seed)
