"""The reference worker: a frozen copy of the initial policy scoring log-probabilities."""

from __future__ import annotations

import numpy as np
import ray

from rlsys.types import TrainBatch


@ray.remote
class ReferenceWorker:
    """Holds the frozen reference model; one role, one class."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        micro_batch_size: int,
        temperature: float,
        threads: int,
        num_gpus: float,
    ) -> None:
        from rlsys.models.loading import load_model
        from rlsys.runtime import limit_threads, pick_device, quiet_libraries

        quiet_libraries()
        limit_threads(threads)
        self.device = pick_device(num_gpus)
        self.model = load_model(model_path, dtype).to(self.device)
        self.micro = micro_batch_size
        self.temperature = temperature

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        return ray.get_runtime_context().get_node_id()

    def ready(self) -> bool:
        return True

    def forward_logprobs(self, batch: TrainBatch) -> np.ndarray:
        """(B, T-1) reference log-probabilities of ``batch``."""
        import torch

        from rlsys.models.logprobs import first_scored, token_logprobs

        chunks = []
        with torch.no_grad():
            for start in range(0, len(batch), self.micro):
                rows = slice(start, start + self.micro)
                # torch.tensor copies: arrays from Ray's object store are read-only
                ids = torch.tensor(batch.input_ids[rows])
                mask = torch.tensor(batch.attention_mask[rows])
                logprobs, _ = token_logprobs(
                    self.model,
                    ids.to(self.device),
                    mask.to(self.device),
                    self.temperature,
                    first_scored(torch.from_numpy(batch.loss_mask[rows])),
                )
                chunks.append(logprobs.cpu().numpy())
        return np.concatenate(chunks)
