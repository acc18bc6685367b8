"""A step's rooflines as ``perf/*`` metrics: the learner's achieved TFLOP/s and MFU, the
engines' share of memory bandwidth while decoding, and the step's floor (docs/roofline.md).

FLOPs are counted from the policy's config (``rlsys.perf.flops``) on the batch's real
tokens, the LM head on its response tokens (padding the learner computes counts as waste,
see ``perf/padding_frac``). The peak is the learner ranks' own, measured once at start in
the learner's compute dtype (``LearnerGroup.machine_peak``).
"""

from __future__ import annotations

import numpy as np

from rlsys.backends.packing import PackInputs
from rlsys.config.schema import TrainConfig
from rlsys.engines.prefill import common_head
from rlsys.perf.flops import ModelShape, decode_weight_bytes, forward_flops, generation_flops
from rlsys.perf.machine import MachinePeak
from rlsys.perf.roofline import StepWork, floor_seconds
from rlsys.types import TrainBatch


class Roofline:
    """Turns a step's batch, stage times and decode steps into ``perf/*`` rooflines."""

    def __init__(
        self,
        shape: ModelShape,
        peak: MachinePeak,
        decode_bytes_per_step: int,
        train_passes: int,
        reference: bool,
        train_forwards: int = 3,
        share_prompts: bool = False,
    ) -> None:
        self.shape, self.peak = shape, peak
        self.decode_bytes_per_step = decode_bytes_per_step  # weights read by one decode step
        self.train_passes = train_passes  # forward + backward passes over the batch a step
        self.reference = reference  # a reference model runs a forward over the batch
        # forwards' worth of FLOPs in one training pass: 3 (the backward is twice the
        # forward); 2 with LoRA (no weight gradients for the frozen weights)
        self.train_forwards = train_forwards
        # the learner packs with shared prompts (learner.packing and share_prompts): its
        # forward counts a shared prompt once, as it computes it
        self.share_prompts = share_prompts
        self._learner = 0.0  # the learner's forward FLOPs for the batch
        self._trained = 0.0  # the same for the rows the train step computes (not skipped)
        self._generation = 0.0  # the engines' forward FLOPs for the batch (prompts once)

    @classmethod
    def for_run(cls, cfg: TrainConfig, pools) -> Roofline:
        """The policy's shape and the learner ranks' peak in their compute dtype (measured
        now, before the rollout loops start competing for the machine)."""
        shape = ModelShape.from_path(pools.rollout.model_path)
        dtype = cfg.learner.mixed_precision or cfg.model.dtype
        return cls(
            shape,
            pools.learner.machine_peak(dtype),
            decode_weight_bytes(shape, pools.rollout.dtype),
            cfg.learner.ppo_epochs,
            cfg.algorithm.uses_reference,
            train_forwards=2 if cfg.model.lora.enabled else 3,
            share_prompts=cfg.learner.packing and cfg.learner.share_prompts,
        )

    def observe(self, batch: TrainBatch, skip: np.ndarray | None = None) -> None:
        """The step's learner batch: the engines' and the learner's forward FLOPs over it;
        ``skip``: the rows its train step leaves out (``learner.skip_zero_advantage``)."""
        mask = np.asarray(batch.attention_mask)
        rows, lengths = np.arange(len(mask)), mask.sum(1)
        scored = (np.asarray(batch.loss_mask) > 0).sum(1)

        def head(kept: np.ndarray) -> float:  # the LM head on the kept rows' scored tokens
            return 2.0 * self.shape.head_params * int(scored[kept].sum())

        heads = head(rows)
        pack = PackInputs.of(batch.input_ids, mask, batch.loss_mask, share_prompts=True)
        if pack.prompts is None:  # nothing trained: no prompt to tell from a reply
            self._generation = self._learner = forward_flops(self.shape, lengths, 0) + heads
            self._trained = self._learner
            return

        def once(unit: np.ndarray) -> float:  # the unit's rows share one prompt, computed once
            prompt = int(pack.prompt_lengths[unit[0]])
            return generation_flops(self.shape, [prompt], [(prompt, lengths[r]) for r in unit], 0)

        # the engines prefill each distinct prompt once, the head they all share once
        # (rlsys/engines/prefill.py); the learner as its plan packs
        groups = [rows[pack.prompts == k] for k in np.unique(pack.prompts)]
        ids = np.asarray(batch.input_ids)
        shared = common_head(
            [ids[g[0]][mask[g[0]] > 0][: pack.prompt_lengths[g[0]]].tolist() for g in groups]
        )
        again = (len(groups) - 1) * forward_flops(self.shape, [shared], 0) if shared else 0.0
        self._generation = sum(once(g) for g in groups) - again + heads

        def learner(kept: np.ndarray) -> float:  # as the learner's plan packs the rows
            units = pack.units(kept, 1, mask.shape[1]) if self.share_prompts else kept[:, None]
            return sum(once(u) for u in units) + head(kept)

        self._learner = learner(rows)
        self._trained = self._learner if skip is None else learner(rows[~skip])

    def add(self, metrics: dict[str, float]) -> dict[str, float]:
        """``metrics`` (with ``time/*`` and ``perf/step_s``) plus the step's rooflines."""
        forward, trained, generation = self._learner, self._trained, self._generation
        self._generation, self._learner, self._trained = 0.0, 0.0, 0.0
        learner_s = metrics.get("time/train", 0.0) + metrics.get("time/learner_logprobs", 0.0)
        passes = self.train_forwards * self.train_passes * ("time/train" in metrics)
        logprobs = "time/learner_logprobs" in metrics  # a forward pass over every row
        work = StepWork(
            learner_flops=passes * trained + logprobs * forward,
            reference_flops=forward if self.reference else 0.0,
            generation_flops=generation,  # the kept samples, each distinct prompt once
            decode_bytes=self.decode_bytes_per_step * metrics.get("rollout/decode_steps", 0),
            sync_bytes=metrics.get("perf/weight_sync_bytes", 0.0),
        )
        out = dict(metrics)
        if learner_s > 0 and work.learner_flops > 0:
            tflops = work.learner_flops / learner_s / 1e12
            out["perf/learner_tflops"] = tflops
            out["perf/mfu"] = tflops / self.peak.matmul_tflops
            if self.peak.published_tflops:
                out["perf/mfu_published"] = tflops / self.peak.published_tflops
        generation_s = metrics.get("time/generation", 0.0)
        if generation_s > 0 and work.decode_bytes > 0:
            achieved = work.decode_bytes / generation_s / 1e9
            out["perf/decode_bw_frac"] = achieved / self.peak.copy_gbps
        floors = floor_seconds(work, self.peak)
        out.update({f"perf/floor_{stage}_s": s for stage, s in floors.items() if stage != "step"})
        out["perf/floor_s"] = floors["step"]
        if floors["step"] > 0:
            out["perf/step_over_floor"] = metrics["perf/step_s"] / floors["step"]
        out["perf/peak_tflops"] = self.peak.matmul_tflops
        out["perf/copy_gbps"] = self.peak.copy_gbps
        return out
