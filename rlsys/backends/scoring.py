"""The frozen-scorer part of a backend: forward-only passes, no gradients, each rank scoring
its share of a batch micro-batch by micro-batch. A reference policy (``trainable=False``)
does only this; a learner does it too (the policy's log-probabilities before an update, the
critic's values, a reward model's scores). Every pass is collective: all ranks call it with
the same batch, and each returns its rows and their results."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rlsys.backends.data_parallel import forward_plan, packed_forward_plan
from rlsys.backends.engine import BackendEngine
from rlsys.backends.roles import vision
from rlsys.models import lora
from rlsys.models.logprobs import greedy_next_tokens
from rlsys.models.value import sequence_scores
from rlsys.types import TrainBatch


class FrozenScorer(BackendEngine):
    """Forward passes over a batch: log-probabilities, values, scores, greedy tokens."""

    @torch.no_grad()
    def _map_rows(
        self, batch: TrainBatch, fn: Callable, packable: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Apply ``fn(tensors) -> (rows, ...) tensor`` to this rank's rows, micro-batch-wise;
        ``packable``: ``fn`` takes packed micro-batches (used with ``learner.packing``)."""
        if self.module.training:  # eval() walks every module: a reference never leaves it
            self.model.eval()
        rows_out, chunks = [np.zeros(0, dtype=np.int64)], []
        for rows, packed in self._forward_plan(batch, packable):
            with self._autocast():  # every fn returns fp32 (or token ids) under autocast too
                out = fn(self._tensors(batch, rows, packed))
            if len(rows):
                rows_out.append(rows)
                chunks.append(out.cpu().numpy())
        if not chunks:
            return rows_out[0], np.zeros((0, batch.loss_mask.shape[1]), np.float32)
        return np.concatenate(rows_out), np.concatenate(chunks)

    def _forward_plan(self, batch: TrainBatch, packable: bool):
        """This rank's micro-batches: (rows, packed row of each or None)."""
        micro = self._micro_rows(batch)
        pack = self._pack_inputs(batch) if packable else None
        if pack is not None:
            length = batch.input_ids.shape[1]
            return packed_forward_plan(pack, length, self.world_size, self.rank, micro)
        plan = forward_plan(len(batch), self.world_size, self.rank, micro)
        return [(rows, None) for rows in plan]

    def forward_logprobs(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and their (rows, T-1) log-probabilities under the current policy."""
        return self._map_rows(batch, lambda t: self._token_logprobs(t)[0], packable=True)

    def forward_base_logprobs(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """``forward_logprobs`` of the base model, LoRA adapters off: a LoRA run's reference
        policy, computed by the learner itself (no reference model is loaded)."""
        if self.lora is None:
            raise RuntimeError("forward_base_logprobs needs LoRA adapters (model.lora.rank > 0)")
        with lora.adapters_off(self.module):
            return self.forward_logprobs(batch)

    def forward_values(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and their (rows, T-1) values (critic only)."""
        return self._map_rows(batch, self._token_values, packable=True)

    def forward_scores(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and their (rows,) sequence scores (reward models only)."""
        return self._map_rows(
            batch, lambda t: sequence_scores(self.model, t["input_ids"], t["attention_mask"])
        )

    def greedy_tokens(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and the argmax next token at every position, (rows, T-1)."""
        return self._map_rows(
            batch,
            lambda t: greedy_next_tokens(
                self.model, t["input_ids"], t["attention_mask"], vision(t), self.logits_chunk
            ),
        )
