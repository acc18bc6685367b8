"""The engine every training backend shares, whatever its role: the model of one
data-parallel rank (loaded per role, with LoRA, frozen vision, activation checkpointing and
compiled layers as configured), its AdamW optimizer, the state its schedule and checkpoints
keep, how a micro-batch's tensors are cut and autocast, and the hooks a backend (FSDP2,
DeepSpeed) implements: how the model is wrapped, backward, the clipped optimizer step,
full-weight gathering and its sharded model + optimizer checkpoint.

It runs inside one learner rank after ``torch.distributed`` is initialised (gloo on CPU, NCCL
on GPU). What it is used for lives beside it: forward-only passes in ``scoring.py``, train
steps in ``training.py``, full weights in ``weights.py``, checkpoints in ``resume.py``;
``base.py`` joins them into ``TrainingBackend``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from rlsys.backends import checkpoint as ckpt
from rlsys.backends.data_parallel import micro_batch_rows
from rlsys.backends.memory import MemorySettings
from rlsys.backends.packing import PackInputs
from rlsys.backends.roles import MODEL_ROLES, ROLES, vision
from rlsys.config.learner import OptimConfig
from rlsys.config.schema import LoraConfig
from rlsys.models import blocks, lora
from rlsys.models.attention import use_fp32_attention
from rlsys.models.logprobs import first_scored, token_logprobs
from rlsys.models.packing import packed_token_logprobs, packed_token_values
from rlsys.models.value import token_values
from rlsys.models.vision import VISION_PREFIX, vision_inputs
from rlsys.types import PromptPixels, TrainBatch

_TENSOR_FIELDS = (
    "advantages",
    "old_logprobs",
    "ref_logprobs",
    "behaviour_logprobs",
    "values",
    "returns",
    "is_weights",
)


def _stay_fused(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = True, None


class BackendEngine(ABC):
    """One rank of a data-parallel model and its optimizer, in one of the roles of
    ``roles.py``: the policy (``role="policy"``), a critic (``role="value"``) or a reward
    model (``role="reward"``). With ``trainable=False`` it is inference-only (a frozen
    scorer: the reference policy, a reward model scoring): sharded like a learner, but with
    no gradients and no optimizer state.

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
        compile_backend: str | None = None,
        trainable: bool = True,
        lora: LoraConfig | None = None,
        memory: MemorySettings | None = None,
        freeze_vision: bool = False,
        max_tokens_per_micro_batch: int | None = None,
        logits_chunk_tokens: int | None = None,
        packing: bool = False,
        share_prompts: bool = False,
        skip_zero_advantage: bool = False,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"backend role {role!r} is not one of {list(ROLES)}")
        self.role = role
        self.model_role = MODEL_ROLES[role]
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.model_path = model_path
        self.dtype = dtype
        self.micro = micro_batch_size  # rows per micro-batch at most
        self.micro_tokens = max_tokens_per_micro_batch  # rows x padded length at most (None: any)
        self.logits_chunk = logits_chunk_tokens  # positions per LM-head slice (None: all at once)
        self.packing = packing  # micro-batches of packed sequences (rlsys/models/packing.py)
        # packed policy passes hold a prompt once for its samples (learner.share_prompts)
        self.share_prompts = packing and share_prompts and self.model_role.shares_prompts
        # train steps leave out rows whose loss and gradient are zero (objectives.inert_rows)
        self.skip_zero_advantage = skip_zero_advantage
        self.temperature = temperature
        self.device = device
        self.mixed_precision = mixed_precision
        # the dtype forward passes autocast to; None where the backend casts the parameters
        # themselves (FSDP2's MixedPrecisionPolicy) or there is no mixed precision
        self.autocast_dtype = mixed_precision
        # the torch.compile backend the decoder layers compile with; None: eager (no compile)
        self.compile_backend = compile_backend
        self.memory = memory or MemorySettings()
        self.trainable = trainable  # False: forward passes only (a reference), no optimizer
        # LoRA: only adapters train, travel and are checkpointed (the policy, a reward model)
        self.lora = lora if lora is not None and lora.enabled and trainable else None
        if self.lora is not None and not self.model_role.lora:
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
        compiled with the torch.compile backend ``compile_backend`` names, if any
        (rlsys/models/blocks.py)."""
        module = self.model_role.load(self.model_path, self.dtype, self.trainable)
        if not for_training:
            return module
        if self.lora is not None:
            lora.add_adapters(module, self.lora, trainable=self.model_role.lora_heads)
        if self.mixed_precision is not None and self.device.type == "cpu":
            use_fp32_attention(module)
        if self.freeze_vision:
            for name, param in module.named_parameters():
                if name.startswith(VISION_PREFIX):
                    param.requires_grad_(False)
        if self.memory.activation_checkpointing and self.trainable:
            blocks.checkpoint_layers(module)  # before compiling: the checkpoint is traced
        if self.compile_backend is not None:
            blocks.compile_layers(module, self.device, self.compile_backend)
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

    # ---- micro-batches --------------------------------------------------------------------

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

    def _tensors(
        self, batch: TrainBatch, rows: np.ndarray, packed_rows: np.ndarray | None = None
    ) -> dict[str, torch.Tensor]:
        """The micro-batch ``rows``' tensors; with ``packed_rows`` (the packed row of each
        row: ``learner.packing``) also those, as ``packed_row``."""
        dummy = len(rows) == 0  # keep collectives aligned: run row 0 with nothing trained
        rows = np.array([0]) if dummy else rows
        out = {
            "input_ids": torch.from_numpy(batch.input_ids[rows]).to(self.device),
            "attention_mask": torch.from_numpy(batch.attention_mask[rows]).to(self.device),
            "loss_mask": torch.from_numpy(batch.loss_mask[rows]).to(self.device),
        }
        if packed_rows is not None:
            packed = np.zeros(1, np.int64) if dummy else packed_rows
            out["packed_row"] = torch.from_numpy(packed).to(self.device)
        if dummy:
            out["loss_mask"] = torch.zeros_like(out["loss_mask"])
        for name in _TENSOR_FIELDS:
            value = getattr(batch, name)
            if value is not None:
                out[name] = torch.from_numpy(value[rows]).to(self.device)
        if batch.pixel_values is not None and self.packing:
            raise ValueError(
                "learner.packing=true does not pack a vision-language model's rows (their "
                "images and multimodal positions); set learner.packing=false"
            )
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

    def _pack_inputs(self, batch: TrainBatch) -> PackInputs | None:
        """What the plans pack by when micro-batches are packed (``learner.packing``; the
        policy and the critic, not a reward model), else None."""
        if not (self.packing and self.model_role.packs):
            return None
        return PackInputs.of(
            batch.input_ids, batch.attention_mask, batch.loss_mask, self.share_prompts
        )

    def _share_until(self, first: int) -> int | None:
        """The last column a packed micro-batch's rows may share (``learner.share_prompts``):
        ``first``, its first scored column (the prompts' last token); None: share nothing."""
        return first if self.share_prompts and first > 0 else None

    def _token_logprobs(
        self, t: dict[str, torch.Tensor], entropy: bool = False, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The policy's (B, T-1) log-probabilities (and entropies) of the micro-batch ``t``,
        packed when it has ``packed_row``: the one call of every pass that needs them."""
        first = first_scored(t["loss_mask"])
        if "packed_row" in t:
            return packed_token_logprobs(
                self.model,
                t["input_ids"],
                t["attention_mask"],
                t["packed_row"],
                self.temperature,
                first,
                entropy,
                entropy_grad,
                self.logits_chunk,
                self._share_until(first),
            )
        return token_logprobs(
            self.model,
            t["input_ids"],
            t["attention_mask"],
            self.temperature,
            first,
            entropy=entropy,
            entropy_grad=entropy_grad,
            vision=vision(t),
            slice_tokens=self.logits_chunk,
        )

    def _token_values(self, t: dict[str, torch.Tensor]) -> torch.Tensor:
        """The critic's (B, T-1) values of the micro-batch ``t``, packed when it has
        ``packed_row``."""
        if "packed_row" in t:
            share_until = self._share_until(first_scored(t["loss_mask"]))
            return packed_token_values(
                self.model, t["input_ids"], t["attention_mask"], t["packed_row"], share_until
            )
        return token_values(self.model, t["input_ids"], t["attention_mask"])
