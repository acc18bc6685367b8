"""What every training backend shares: the batch loop, the loss weighting, the learning-rate
schedule, the forward passes, weight buckets and the backend-independent checkpoint parts.

A backend (FSDP2, DeepSpeed) supplies only how the model is wrapped, backward, the clipped
optimizer step, full-weight gathering and its sharded model + optimizer checkpoint. It runs
inside one learner rank after ``torch.distributed`` is initialised (gloo on CPU, NCCL on GPU).
Every public method is collective: all ranks call it with the same batch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from rlsys.algorithms.losses import loss_weights
from rlsys.algorithms.objectives import Objective
from rlsys.backends import checkpoint as ckpt
from rlsys.backends.data_parallel import forward_plan, micro_batch_rows, train_plan
from rlsys.backends.schedule import lr_at
from rlsys.checkpoint.store import fsync_tree
from rlsys.config.learner import LearnerConfig, OptimConfig
from rlsys.config.schema import LoraConfig
from rlsys.models import blocks, lora
from rlsys.models.attention import use_fp32_attention
from rlsys.models.loading import load_model, save_tokenizer
from rlsys.models.logprobs import first_scored, greedy_next_tokens, token_logprobs
from rlsys.models.reward_model import load_reward_model
from rlsys.models.value import load_score_model, load_value_model, sequence_scores, token_values
from rlsys.models.vision import SUPPRESS_KEY, VISION_PREFIX, vision_inputs
from rlsys.types import PromptPixels, TrainBatch

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
ROLES = ("policy", "value", "reward")
_VISION_KEYS = ("pixel_values", "image_grid_thw", "mm_token_type_ids", SUPPRESS_KEY)


def _vision(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """A micro-batch's image inputs (VL models), None without."""
    return {k: t[k] for k in _VISION_KEYS if k in t} or None


SCORE_HEADS = ("score.",)  # a sequence-classification model's head: trained in full under LoRA


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """What a learner trades for memory: the ``learner.`` keys of the same names."""

    activation_checkpointing: bool = False  # recompute decoder layers in backward
    offload: bool = False  # parameters, gradients and optimizer state in host memory
    reduce_dtype: str = "float32"  # gradient reduction dtype under sharded mixed precision

    @classmethod
    def of(cls, cfg: LearnerConfig) -> MemorySettings:
        return cls(cfg.activation_checkpointing, cfg.offload, cfg.reduce_dtype)


def _stay_fused(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = True, None


class TrainingBackend(ABC):
    """One rank of a data-parallel model and its optimizer: the policy (``role="policy"``,
    log-probabilities), a critic (``role="value"``, a value head on the same decoder) or a
    reward model being trained (``role="reward"``, a sequence-classification model: one
    score per sequence).

    With ``trainable=False`` it is inference-only (the frozen reference policy): sharded
    like a learner, but with no gradients and no optimizer state; forward passes only.

    A subclass's constructor sets ``model`` and ``module``; it implements the abstract
    methods."""

    name: ClassVar[str]  # the learner.backend value
    match_keys: ClassVar[tuple[str, ...]] = ("backend", "role", "dtype", "lora")  # load_checkpoint
    model: Any  # what forward passes call (the engine, for DeepSpeed)
    module: torch.nn.Module  # the plain model: its parameter names are the Hugging Face ones

    def __init__(
        self,
        model_path: str,
        dtype: str,
        optim: OptimConfig,
        micro_batch_size: int,
        temperature: float,
        device: torch.device,
        role: str = "policy",
        mixed_precision: str | None = None,
        compile_layers: bool = False,
        trainable: bool = True,
        lora: LoraConfig | None = None,
        memory: MemorySettings | None = None,
        freeze_vision: bool = False,
        max_tokens_per_micro_batch: int | None = None,
        logits_chunk_tokens: int | None = None,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"backend role {role!r} is not one of {list(ROLES)}")
        self.role = role
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.model_path = model_path
        self.dtype = dtype
        self.micro = micro_batch_size  # rows per micro-batch at most
        self.micro_tokens = max_tokens_per_micro_batch  # rows x padded length at most (None: any)
        self.logits_chunk = logits_chunk_tokens  # positions per LM-head slice (None: all at once)
        self.temperature = temperature
        self.device = device
        self.mixed_precision = mixed_precision
        # the dtype forward passes autocast to; None where the backend casts the parameters
        # themselves (FSDP2's MixedPrecisionPolicy) or there is no mixed precision
        self.autocast_dtype = mixed_precision
        self.compile_layers = compile_layers
        self.memory = memory or MemorySettings()
        self.trainable = trainable  # False: forward passes only (a reference), no optimizer
        # LoRA: only adapters train, travel and are checkpointed (the policy, a reward model)
        self.lora = lora if lora is not None and lora.enabled and trainable else None
        if self.lora is not None and role == "value":
            raise ValueError("LoRA adapters are for the policy and reward models, not a critic")
        # a VL model's vision tower (VISION_PREFIX) neither trains nor travels in weight syncs
        self.freeze_vision = freeze_vision
        self.optim_cfg = optim
        self.base_lr = optim.lr
        self.optimizer_steps = 0
        self.decay_steps: int | None = None  # set by set_lr; None: no decay (constant)
        self.schedule_start = 0
        self.last_lr = 0.0  # learning rate of the latest optimizer step

    def _load_module(self, for_training: bool = True) -> torch.nn.Module:
        """The role's model from ``model_path`` in ``dtype``, on the CPU; for training, with
        LoRA adapters when ``lora`` (everything else frozen but a reward model's score head),
        attention in fp32 when a CPU learner computes in bf16 (see rlsys/models/attention.py),
        its decoder layers recomputed in backward when ``memory.activation_checkpointing`` and
        compiled when ``compile_layers`` (rlsys/models/blocks.py)."""
        loader = {"policy": load_model, "value": load_value_model, "reward": load_score_model}
        if self.role == "reward" and not self.trainable:  # scoring: its head must be trained
            loader["reward"] = lambda path, dtype: load_reward_model(path, dtype)[1]
        module = loader[self.role](self.model_path, self.dtype)
        if not for_training:
            return module
        if self.lora is not None:
            lora.add_adapters(
                module, self.lora, trainable=SCORE_HEADS if self.role == "reward" else ()
            )
        if self.mixed_precision is not None and self.device.type == "cpu":
            use_fp32_attention(module)
        if self.freeze_vision:
            for name, param in module.named_parameters():
                if name.startswith(VISION_PREFIX):
                    param.requires_grad_(False)
        if self.memory.activation_checkpointing and self.trainable:
            blocks.checkpoint_layers(module)  # before compiling: the checkpoint is traced
        if self.compile_layers:
            blocks.compile_layers(module, self.device)
        return module

    def _adam_settings(self) -> dict[str, Any]:
        """``optim``'s AdamW settings as keyword arguments (torch's AdamW, DeepSpeedCPUAdam)."""
        cfg = self.optim_cfg
        return {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay}

    def _trained(self, module: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The parameters the optimizer steps: all of them, or with LoRA the adapters (and a
        reward model's head); frozen ones get no gradient and no optimizer state."""
        return [p for p in module.parameters() if p.requires_grad]

    def _adamw(self, params) -> torch.optim.AdamW:
        """AdamW over ``params`` with ``optim``'s settings, fused: one kernel over all
        tensors instead of a loop of element-wise ops per tensor. On one core of this
        project's Xeon a step over SmolLM2-135M's fp32 weights took 144 ms fused against 567 ms
        (loop, torch's CPU default) and 621 ms (foreach); over the 3M-parameter model 3 ms
        against 12 and 17 ms. Same update up to float rounding."""
        optimizer = torch.optim.AdamW(params, **self._adam_settings(), fused=True)
        # Loading a state dict copies its groups' flags over ours: one saved before fused
        # AdamW ("fused": None) would switch a resumed run back to the slow loop.
        optimizer.register_load_state_dict_post_hook(_stay_fused)
        return optimizer

    # ---- what a backend implements ------------------------------------------------------

    @abstractmethod
    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        """Accumulate gradients of ``loss``; ``boundary``: the mini-batch's last micro-batch."""

    @abstractmethod
    def _step(self, lr: float) -> tuple[float, bool]:
        """Clip gradients to ``optim.grad_clip`` and take an optimizer step at ``lr`` unless
        the global grad norm is not finite; leave no gradients behind. Returns the global
        grad norm (before clipping) and whether the step was taken."""

    @abstractmethod
    def _zero_grad(self) -> None:
        """Drop gradients before a mini-batch."""

    @abstractmethod
    def _full_weights(self) -> Iterator[tuple[str, torch.Tensor | None]]:
        """Collective: (HF name, full tensor) for every parameter (tied ones once) and
        persistent buffer, gathered one at a time; the tensor is None on ranks other than 0."""

    @abstractmethod
    def _save_shards(self, root: Path) -> None:
        """Collective: write model + optimizer state, sharded, under ``root``."""

    @abstractmethod
    def _load_shards(self, root: Path) -> None:
        """Collective: read what ``_save_shards`` wrote under ``root`` into this backend."""

    def _info(self) -> dict[str, Any]:
        """What ``backend.json`` records about the writer."""
        return {
            "format_version": ckpt.FORMAT_VERSION,
            "backend": self.name,
            "zero_stage": None,
            "role": self.role,
            "model_path": self.model_path,
            "dtype": self.dtype,
            "world_size": self.world_size,
            "lora": None if self.lora is None else dataclasses.asdict(self.lora),
        }

    # ---- learning rate --------------------------------------------------------------------

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

    # ---- forward passes -------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager:
        """Where forward passes run: under ``torch.autocast`` in ``mixed_precision`` (matmuls
        and attention in bf16, reductions in fp32; the weights, their gradients and the
        optimizer state stay in ``dtype``), or as they are when it is None."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        autocast = torch.autocast(self.device.type, dtype=getattr(torch, self.autocast_dtype))
        if self.lora is None:
            return autocast
        # PEFT casts each adapter's bf16 input up to its fp32 weights, which autocast then
        # casts back down: a copy per adapter and pass for nothing (SmolLM2 at rank 16, two
        # micro-batches of 16 forward + backward on this CPU: 4.8 s -> 4.6 s)
        stack = contextlib.ExitStack()
        stack.enter_context(autocast)
        stack.enter_context(lora.no_input_casts(self.module))
        return stack

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
        if batch.pixel_values is not None:  # a VL model: these rows' images, in row order
            pixels = [
                None
                if batch.pixel_values[r] is None
                else PromptPixels(batch.pixel_values[r], batch.image_grid_thw[r])
                for r in rows
            ]
            out.update(vision_inputs(self.module.config, out["input_ids"], pixels, self.device))
        return out

    def _micro_rows(self, batch: TrainBatch) -> int:
        """Rows per micro-batch of ``batch`` (see ``micro_batch_rows``): every pass cuts with
        this."""
        return micro_batch_rows(self.micro, self.micro_tokens, batch.input_ids.shape[1])

    @torch.no_grad()
    def _map_rows(self, batch: TrainBatch, fn: Callable) -> tuple[np.ndarray, np.ndarray]:
        """Apply ``fn(tensors) -> (rows, ...) tensor`` to this rank's rows, micro-batch-wise."""
        if self.module.training:  # eval() walks every module: a reference never leaves it
            self.model.eval()
        rows_out, chunks = [np.zeros(0, dtype=np.int64)], []
        for rows in forward_plan(len(batch), self.world_size, self.rank, self._micro_rows(batch)):
            with self._autocast():  # every fn returns fp32 (or token ids) under autocast too
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
                self.model,
                t["input_ids"],
                t["attention_mask"],
                self.temperature,
                first_scored(t["loss_mask"]),
                vision=_vision(t),
                slice_tokens=self.logits_chunk,
            )[0],
        )

    def forward_base_logprobs(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """``forward_logprobs`` of the base model, LoRA adapters off: a LoRA run's reference
        policy, computed by the learner itself (no reference model is loaded)."""
        if self.lora is None:
            raise RuntimeError("forward_base_logprobs needs LoRA adapters (model.lora.rank > 0)")
        with lora.adapters_off(self.module):
            return self.forward_logprobs(batch)

    def forward_values(self, batch: TrainBatch) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows and their (rows, T-1) values (critic only)."""
        return self._map_rows(
            batch, lambda t: token_values(self.model, t["input_ids"], t["attention_mask"])
        )

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
                self.model, t["input_ids"], t["attention_mask"], _vision(t), self.logits_chunk
            ),
        )

    def _outputs(self, t: dict[str, torch.Tensor], entropy_grad: bool) -> dict[str, torch.Tensor]:
        """What the objective sees for one micro-batch."""
        if self.role == "value":
            return {"values": token_values(self.model, t["input_ids"], t["attention_mask"])}
        if self.role == "reward":
            return {"scores": sequence_scores(self.model, t["input_ids"], t["attention_mask"])}
        logprobs, entropy = token_logprobs(
            self.model,
            t["input_ids"],
            t["attention_mask"],
            self.temperature,
            first_scored(t["loss_mask"]),
            entropy=True,
            entropy_grad=entropy_grad,
            vision=_vision(t),
            slice_tokens=self.logits_chunk,
        )
        return {"logprobs": logprobs, "entropy": entropy}

    # ---- training -------------------------------------------------------------------------

    def train_step(
        self,
        batch: TrainBatch,
        objective: Objective,
        num_mini_batches: int,
        epochs: int,
        seed: int,
    ) -> dict[str, float]:
        """Epochs x mini-batches optimizer steps; returns metrics averaged over all ranks,
        with ``skipped_steps``: optimizer steps left out for a non-finite grad norm."""
        if not self.trainable:
            raise RuntimeError("an inference-only backend (trainable=False) has no optimizer")
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        tokens = 0.0
        grad_norms = []
        skipped = 0
        for epoch in range(epochs):
            plans = train_plan(
                batch.loss_mask,
                self.world_size,
                self.rank,
                num_mini_batches,
                self._micro_rows(batch),
                seed + epoch,
                objective.rows_per_group,
            )
            for plan in plans:
                self._zero_grad()
                for i, rows in enumerate(plan.micro_batches):
                    t = self._tensors(batch, rows)
                    with self._autocast():
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
                    # Both backends average gradients over ranks (FSDP's reduce-scatter, ZeRO's
                    # averaged reduce); the loss is a global sum. where(): whatever a padded
                    # position holds (even inf) contributes exactly 0.
                    loss = torch.where(mask > 0, per_token * weights, 0.0).sum() * self.world_size
                    self._backward(loss, boundary=i == len(plan.micro_batches) - 1)
                    with torch.no_grad():
                        sums["loss"] += float((per_token * mask).sum())
                        if "entropy" in out:
                            sums["entropy"] += float((out["entropy"] * mask).sum())
                        if "values" in out:
                            sums["values"] += float((out["values"] * mask).sum())
                        for name, value in metrics.items():
                            sums[name] += float((value * mask).sum())
                        tokens += float(mask.sum())
                lr = self._current_lr()
                norm, stepped = self._step(lr)
                grad_norms.append(norm)
                if stepped:
                    self.last_lr = lr
                    self.optimizer_steps += 1
                else:
                    skipped += 1
                    log.warning("non-finite grad norm %s: optimizer step skipped", norm)
        out = self._reduce(sums, tokens, grad_norms)
        out["skipped_steps"] = float(skipped)  # the same on every rank: the norm is global
        return out

    def _reduce(self, sums: dict[str, float], tokens: float, grad_norms: list[float]):
        names = sorted(sums)
        # on the learner's device: an NCCL group has no CPU collectives
        values = [sums[n] for n in names] + [tokens]
        packed = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(packed)
        packed = packed.cpu()
        total = max(float(packed[-1]), 1.0)
        out = {name: float(packed[i]) / total for i, name in enumerate(names)}
        if "clipped" in out:
            out["clip_frac"] = out.pop("clipped")
        out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        out["lr"] = self.last_lr
        out["trained_tokens"] = float(packed[-1])
        return out

    # ---- full weights ---------------------------------------------------------------------

    @torch.no_grad()
    def iter_weight_buckets(self, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """Full (unsharded) tensors, gathered one parameter at a time, in buckets of at most
        ``bucket_bytes`` (a single larger tensor gets a bucket of its own). Collective: every
        rank iterates; only rank 0 yields non-empty buckets. Tied weights are sent once.

        Tensors stay on the learner's device in its parameter dtype and may alias live
        parameters: a consumer copies them before the next optimizer step. Only the bucket
        being built is held, so gathering costs one bucket."""
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        for name, full in self._full_weights():
            if full is None:
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
        """Parameters (tied ones once, as ``named_parameters`` dedupes) + persistent buffers;
        with LoRA only what trains (the adapters, by wire name; see rlsys/models/lora.py):
        the base never changes, so it never travels."""
        if self.lora is not None:
            return [
                (lora.wire_name(n), p) for n, p in self.module.named_parameters() if p.requires_grad
            ]
        persistent = self.module.state_dict().keys()
        buffers = [(n, b) for n, b in self.module.named_buffers() if n in persistent]
        named = list(self.module.named_parameters()) + buffers
        if self.freeze_vision:  # the engines hold the same frozen tower already
            named = [(n, t) for n, t in named if not n.startswith(VISION_PREFIX)]
        return named

    def save_hf(self, path: str) -> None:
        """Write the policy (or reward model) as a Hugging Face directory (rank 0 writes; all
        ranks gather); a critic has no Hugging Face form."""
        if self.role == "value":
            raise ValueError("a critic (role=value) has no Hugging Face form; save a checkpoint")
        state = {}
        for bucket in self.iter_weight_buckets(1 << 30):
            state.update(bucket)
        if self.rank == 0:
            model = self._load_module(for_training=False)
            if self.lora is not None:  # adapters merged into the base: a plain HF model
                state = merged_state(model, state, self.lora.scale)
            model.load_state_dict(state, strict=False)
            out = Path(path)
            if out.exists():
                shutil.rmtree(out)
            model.save_pretrained(out)
            # how a reward model pads: see reward_tokenizer
            save_tokenizer(self.model_path, str(out), "right" if self.role == "reward" else None)
        dist.barrier()

    # ---- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Collective: write model + optimizer state (sharded), the schedule scalars, every
        rank's RNG state and ``backend.json`` into the directory ``path`` (which every rank
        sees; created if missing). Every file is fsynced before this returns."""
        root = Path(path)
        root.mkdir(parents=True, exist_ok=True)
        self._save_shards(root)
        ckpt.save_rng(root, self.rank, self.device)
        if self.rank == 0:
            ckpt.write_json(root / ckpt.BACKEND_INFO, self._info())
            ckpt.write_json(root / ckpt.SCALARS, self._scalars())
        dist.barrier()
        fsync_tree(root)  # each rank: its own files are durable whatever FS it is on
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        """Collective: put this backend in exactly the state it had when ``path`` was saved
        (weights, optimizer, schedule, RNG). Raises ``BackendCheckpointError`` naming ``path``
        when it is missing, damaged or from another backend, role, dtype (or, for DeepSpeed,
        ZeRO stage or world size)."""
        root = Path(path)
        info = ckpt.read_json(root, ckpt.BACKEND_INFO)
        scalars = ckpt.parse_scalars(root, ckpt.read_json(root, ckpt.SCALARS))
        ckpt.check_compatible(root, info, self._info(), self.match_keys)
        if info.get("model_path") != self.model_path:
            log.warning(
                "backend checkpoint %s was saved from model %s, this learner started from %s",
                root,
                info.get("model_path"),
                self.model_path,
            )
        try:
            self._load_shards(root)
        except ckpt.BackendCheckpointError:
            raise
        except Exception as exc:
            raise ckpt.BackendCheckpointError(
                f"backend checkpoint {root}: loading the model/optimizer state failed ({exc}); "
                "the checkpoint is damaged or from another model, load an earlier one"
            ) from exc
        for name, value in scalars.items():
            setattr(self, name, value)
        if not ckpt.load_rng(root, self.rank, self.device):
            log.info("backend checkpoint %s has no RNG state for rank %d", root, self.rank)
        dist.barrier()

    def _scalars(self) -> dict[str, Any]:
        return {
            "optimizer_steps": self.optimizer_steps,
            "schedule_start": self.schedule_start,
            "base_lr": self.base_lr,
            "decay_steps": self.decay_steps,
            "last_lr": self.last_lr,
        }


def merged_state(
    model: torch.nn.Module, state: dict[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """``state`` (wire names: adapters and fully trained tensors) as full weights of the
    plain ``model``: each adapter merged into ``model``'s base weight."""
    pairs, rest = lora.split(state)
    params = model.state_dict()
    for module, (a, b) in pairs.items():
        rest[f"{module}.weight"] = lora.merge(params[f"{module}.weight"], a, b, scale)
    return rest
