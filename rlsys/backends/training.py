"""The trainable part of a backend: optimizer steps on a batch under an objective, and the
learning-rate schedule they follow. Whatever the role (policy, critic, reward model), a
train step is the same loop; the role decides only what the objective sees
(``ModelRole.outputs``). Collective: all ranks call ``train_step`` with the same batch."""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from rlsys.algorithms.losses import loss_weights
from rlsys.algorithms.objectives import Objective, inert_rows
from rlsys.backends.data_parallel import train_plan
from rlsys.backends.engine import BackendEngine
from rlsys.backends.schedule import lr_at
from rlsys.types import TrainBatch

log = logging.getLogger(__name__)


class TrainSteps(BackendEngine):
    """Epochs x mini-batches of optimizer steps, with metrics averaged over ranks."""

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

    def train_step(
        self,
        batch: TrainBatch,
        objective: Objective,
        num_mini_batches: int,
        epochs: int,
        seed: int,
    ) -> dict[str, float]:
        """Epochs x mini-batches optimizer steps; returns metrics averaged over all ranks,
        with ``skipped_steps``: optimizer steps left out for a non-finite grad norm, and with
        ``learner.skip_zero_advantage`` on and an objective that has them, ``skipped_rows_frac``:
        the share of rows left out of the pass as inert (``objectives.inert_rows``; the
        token metrics then average over the rows trained, and are absent when none was)."""
        if not self.trainable:
            raise RuntimeError("an inference-only backend (trainable=False) has no optimizer")
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        tokens = 0.0
        grad_norms = []
        skipped = 0
        covered = 0.0  # the plans' loss tokens, skipped rows' too
        inert = None
        if self.skip_zero_advantage:
            inert = inert_rows(objective, batch.advantages, batch.loss_mask)
        for epoch in range(epochs):
            plans = train_plan(
                batch.loss_mask,
                self.world_size,
                self.rank,
                num_mini_batches,
                self._micro_rows(batch),
                seed + epoch,
                objective.rows_per_group,
                self._pack_inputs(batch),
                inert,
            )
            for plan in plans:
                covered += plan.global_tokens
                self._zero_grad()
                for i, rows in enumerate(plan.micro_batches):
                    packed = None if plan.packed_rows is None else plan.packed_rows[i]
                    t = self._tensors(batch, rows, packed)
                    with self._autocast():
                        out = self.model_role.outputs(self, t, objective.entropy_grad)
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
        out["trained_tokens"] = covered  # the same on every rank: plans are global
        out["skipped_steps"] = float(skipped)  # the same on every rank: the norm is global
        if inert is not None:  # rows left out of the pass (the same on every rank)
            out["skipped_rows_frac"] = float(inert.mean()) if len(inert) else 0.0
        return out

    def _reduce(self, sums: dict[str, float], tokens: float, grad_norms: list[float]):
        names = sorted(sums)
        # on the learner's device: an NCCL group has no CPU collectives
        values = [sums[n] for n in names] + [tokens]
        packed = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(packed)
        packed = packed.cpu()
        total = float(packed[-1])
        # no token computed (every row skipped as inert): no per-token figure, rather than 0s
        out = {name: float(packed[i]) / total for i, name in enumerate(names)} if total else {}
        if "clipped" in out:
            out["clip_frac"] = out.pop("clipped")
        out["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
        out["lr"] = self.last_lr
        return out
