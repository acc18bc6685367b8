"""FSDP2 training backend: ``fully_shard`` per decoder layer, AdamW, bucketed full weights.

Runs inside one learner rank after ``torch.distributed`` is initialised (gloo on CPU, NCCL
on GPU). Every public method is collective: all ranks call it with the same batch.
"""

from __future__ import annotations

import logging
import shutil
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from rlsys.algorithms.losses import loss_weights
from rlsys.algorithms.objectives import Objective
from rlsys.backends.data_parallel import forward_plan, train_plan
from rlsys.backends.schedule import lr_at
from rlsys.config.learner import OptimConfig
from rlsys.models.loading import load_model
from rlsys.models.logprobs import greedy_next_tokens, token_logprobs
from rlsys.models.value import load_value_model, token_values
from rlsys.types import TrainBatch

log = logging.getLogger(__name__)

_TENSOR_FIELDS = (
    "advantages",
    "old_logprobs",
    "ref_logprobs",
    "behaviour_logprobs",
    "values",
    "returns",
    "is_weights",
)
ROLES = ("policy", "value")


# Where decoder layers live: causal LMs (Llama/Qwen-style, GPT-2, GPT-NeoX) and the critic's
# ValueModel, whose decoder is under ``backbone``.
_LAYER_PATHS = (
    "model.layers",
    "transformer.h",
    "gpt_neox.layers",
    "backbone.layers",
    "backbone.h",
)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    for path in _LAYER_PATHS:
        node = model
        for attr in path.split("."):
            node = getattr(node, attr, None)
        if isinstance(node, torch.nn.ModuleList):
            return list(node)
    raise ValueError(f"{type(model).__name__}: cannot find its decoder layers to shard")


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class FSDP2Backend:
    """One rank of an FSDP2-sharded model and its optimizer: the policy (``role="policy"``,
    log-probabilities) or a critic (``role="value"``, a value head on the same decoder)."""

    def __init__(
        self,
        model_path: str,
        dtype: str,
        optim: OptimConfig,
        micro_batch_size: int,
        temperature: float,
        device: torch.device,
        role: str = "policy",
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"backend role {role!r} is not one of {list(ROLES)}")
        self.role = role
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.model_path = model_path
        self.dtype = dtype
        self.micro = micro_batch_size
        self.temperature = temperature
        self.device = device
        self.optim_cfg = optim
        self.base_lr = optim.lr
        self.optimizer_steps = 0
        self.decay_steps: int | None = None  # set by set_lr; None: no decay (constant)
        self.schedule_start = 0
        self.last_lr = 0.0  # learning rate of the latest optimizer step
        loader = load_model if role == "policy" else load_value_model
        model = loader(model_path, dtype).to(device)
        mesh = init_device_mesh(device.type, (self.world_size,))
        for layer in _decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        self.model = model
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=optim.lr,
            betas=tuple(optim.betas),
            weight_decay=optim.weight_decay,
        )

    def set_lr(self, lr: float, decay_steps: int | None = None) -> None:
        """Set the peak learning rate and, for a cosine schedule, the optimizer steps it
        decays over; warm-up and decay restart from the current step."""
        self.base_lr = lr
        self.decay_steps = decay_steps
        self.schedule_start = self.optimizer_steps

    def _current_lr(self) -> float:
        cfg = self.optim_cfg
        return lr_at(
            self.optimizer_steps - self.schedule_start,
            self.base_lr,
            cfg.warmup_steps,
            cfg.schedule,
            cfg.min_lr_ratio,
            self.decay_steps,
        )

    def _tensors(self, batch: TrainBatch, rows: np.ndarray) -> dict[str, torch.Tensor]:
        dummy = len(rows) == 0  # keep collectives aligned: run row 0 with nothing trained
        rows = np.array([0]) if dummy else rows
        out = {
            "input_ids": torch.from_numpy(batch.input_ids[rows]).to(self.device),
            "attention_mask": torch.from_numpy(batch.attention_mask[rows]).to(self.device),
            "loss_mask": torch.from_numpy(batch.loss_mask[rows]).to(self.device),
        }
        if dummy:
            out["loss_mask"] = torch.zeros_like(out["loss_mask"])
        for name in _TENSOR_FIELDS:
            value = getattr(batch, name)
            if value is not None:
                out[name] = torch.from_numpy(value[rows]).to(self.device)
        return out

    @torch.no_grad()
    def _map_rows(self, batch: TrainBatch, fn: Callable) -> tuple[np.ndarray, np.ndarray]:
        """Apply ``fn(tensors) -> (rows, T-1) tensor`` to this rank's rows, micro-batch-wise."""
        self.model.eval()
        rows_out, chunks = [np.zeros(0, dtype=np.int64)], []
        for rows in forward_plan(len(batch), self.world_size, self.rank, self.micro):
            out = fn(self._tensors(batch, rows))
            if len(rows):
                rows_out.append(rows)
                chunks.append(out.cpu().numpy())
        if not chunks:
            return rows_out[0], np.zeros((0, batch.loss_mask.shape[1]), np.float32)
        return np.concatenate(rows_out), np.concatenate(chunks)

    def forward_logprobs(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and their (rows, T-1) log-probabilities under the current policy."""
        return self._map_rows(
            batch,
            lambda t: token_logprobs(
                self.model, t["input_ids"], t["attention_mask"], self.temperature
            )[0],
        )

    def forward_values(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and their (rows, T-1) values (critic only)."""
        return self._map_rows(
            batch, lambda t: token_values(self.model, t["input_ids"], t["attention_mask"])
        )

    def _outputs(self, t: dict[str, torch.Tensor], entropy_grad: bool) -> dict[str, torch.Tensor]:
        """What the objective sees for one micro-batch."""
        if self.role == "value":
            return {"values": token_values(self.model, t["input_ids"], t["attention_mask"])}
        logprobs, entropy = token_logprobs(
            self.model, t["input_ids"], t["attention_mask"], self.temperature, entropy_grad
        )
        return {"logprobs": logprobs, "entropy": entropy}

    def greedy_tokens(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and the argmax next token at every position, (rows, T-1)."""
        return self._map_rows(
            batch, lambda t: greedy_next_tokens(self.model, t["input_ids"], t["attention_mask"])
        )

    def train_step(
        self,
        batch: TrainBatch,
        objective: Objective,
        num_mini_batches: int,
        epochs: int,
        seed: int,
    ) -> dict[str, float]:
        """Epochs x mini-batches optimizer steps; returns metrics averaged over all ranks."""
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        tokens = 0.0
        grad_norms = []
        for epoch in range(epochs):
            plans = train_plan(
                batch.loss_mask,
                self.world_size,
                self.rank,
                num_mini_batches,
                self.micro,
                seed + epoch,
            )
            for plan in plans:
                self.optimizer.zero_grad(set_to_none=True)
                for rows in plan.micro_batches:
                    t = self._tensors(batch, rows)
                    out = self._outputs(t, objective.entropy_grad)
                    per_token, metrics = objective(out, t)
                    mask = t["loss_mask"]
                    weights = loss_weights(
                        mask,
                        objective.loss_agg,
                        plan.global_tokens,
                        plan.global_seqs,
                        objective.loss_agg_norm,
                    )
                    # FSDP averages gradients over ranks; the loss is a global sum. where():
                    # whatever a padded position holds (even inf) contributes exactly 0.
                    loss = torch.where(mask > 0, per_token * weights, 0.0).sum() * self.world_size
                    loss.backward()
                    with torch.no_grad():
                        sums["loss"] += float((per_token * mask).sum())
                        if "entropy" in out:
                            sums["entropy"] += float((out["entropy"] * mask).sum())
                        if "values" in out:
                            sums["values"] += float((out["values"] * mask).sum())
                        for name, value in metrics.items():
                            sums[name] += float((value * mask).sum())
                        tokens += float(mask.sum())
                grad_norms.append(self._clip_and_step())
        return self._reduce(sums, tokens, grad_norms)

    def _clip_and_step(self) -> float:
        max_norm = self.optim_cfg.grad_clip or float("inf")
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        norm = float(_full(norm))
        if np.isfinite(norm):
            self.last_lr = self._current_lr()
            for group in self.optimizer.param_groups:
                group["lr"] = self.last_lr
            self.optimizer.step()
            self.optimizer_steps += 1
        else:
            log.warning("non-finite grad norm %s: optimizer step skipped", norm)
        return norm

    def _reduce(self, sums: dict[str, float], tokens: float, grad_norms: list[float]):
        names = sorted(sums)
        packed = torch.tensor([sums[n] for n in names] + [tokens], dtype=torch.float64)
        dist.all_reduce(packed)
        total = max(float(packed[-1]), 1.0)
        out = {name: float(packed[i]) / total for i, name in enumerate(names)}
        if "clipped" in out:
            out["clip_frac"] = out.pop("clipped")
        out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        out["lr"] = self.last_lr
        out["trained_tokens"] = float(packed[-1])
        return out

    @torch.no_grad()
    def iter_weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """Full (unsharded) tensors, gathered one parameter at a time, in buckets of at most
        ``bucket_bytes`` (a single larger tensor gets a bucket of its own). Collective: every
        rank iterates; only rank 0 yields non-empty buckets. Tied weights are sent once.

        Tensors stay on the learner's device in its parameter dtype and may alias live
        parameters (one process, no sharding): a consumer copies them before the next
        optimizer step. Only the bucket being built is held, so gathering costs one bucket."""
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name, tensor in self._named_weights():
            full = _full(tensor)
            if self.rank != 0:
                continue
            nbytes = full.numel() * full.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = {}, 0
            bucket[name] = full.detach()
            size += nbytes
        if bucket or self.rank != 0:
            yield bucket

    def _named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Parameters (tied ones once, as ``named_parameters`` dedupes) + persistent buffers."""
        persistent = self.model.state_dict().keys()
        buffers = [(n, b) for n, b in self.model.named_buffers() if n in persistent]
        return list(self.model.named_parameters()) + buffers

    def save_hf(self, path: str) -> None:
        """Write the policy as a Hugging Face directory (rank 0 writes; all ranks gather)."""
        state = {}
        for bucket in self.iter_weight_buckets(1 << 30):
            state.update(bucket)
        if self.rank == 0:
            from transformers import AutoTokenizer

            model = load_model(self.model_path, self.dtype)
            model.load_state_dict(state, strict=False)
            out = Path(path)
            if out.exists():
                shutil.rmtree(out)
            model.save_pretrained(out)
            AutoTokenizer.from_pretrained(self.model_path).save_pretrained(out)
        dist.barrier()
