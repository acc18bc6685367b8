"""``auto`` precision: bf16 where the hardware has bf16 matmul units, fp32 elsewhere.

``learner.mixed_precision``, ``critic.mixed_precision`` and ``rollout.dtype`` take ``auto``.
It is decided once, when the config is read by the program that runs the job (``rlsys
train`` on the machine that drives the run; ``rlsys submit`` ships the overrides and the job
decides on the cluster), and the run's ``config.yaml`` keeps the decision:

- a pool with GPUs (``num_gpus_per_rank`` / ``num_gpus_per_worker`` > 0) gets bf16, unless
  this machine sees CUDA devices without bf16 (before Ampere);
- a CPU pool gets bf16 where this CPU has AMX tiles or avx512_bf16 instructions (bf16 is
  1.7x faster than fp32 for SmolLM2's step on an EPYC with avx512_bf16, docs/roofline.md; it
  is several times slower on a CPU with neither), fp32 otherwise;
- mixed precision needs fp32 master weights, so ``model.dtype`` other than float32 gets
  none.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rlsys.config.schema import TrainConfig

AUTO = "auto"


@dataclass(frozen=True)
class Bf16Units:
    """Whether the CPU and the GPUs of this machine compute bf16 fast, and why (for the log)."""

    cpu: bool
    cpu_reason: str
    gpu: bool
    gpu_reason: str

    @classmethod
    def here(cls) -> Bf16Units:
        import torch

        from rlsys.perf.machine import cpu_info

        info = cpu_info()
        units = [
            name for name, has in (("AMX", info.amx), ("avx512_bf16", info.avx512_bf16)) if has
        ]
        cpu_reason = (
            f"this CPU has {' and '.join(units)}" if units else "this CPU has no AMX or avx512_bf16"
        )
        if torch.cuda.is_available():
            gpu = torch.cuda.is_bf16_supported()
            name = torch.cuda.get_device_name(0)
            gpu_reason = f"{name} {'has' if gpu else 'lacks'} bf16"
        else:
            gpu, gpu_reason = True, "GPUs since Ampere have bf16 (no GPU on this machine to ask)"
        return cls(bool(units), cpu_reason, gpu, gpu_reason)


# (section, key): the keys that take ``auto``; a rollout worker's GPUs decide rollout.dtype,
# a rank's the others
AUTO_KEYS = (("learner", "mixed_precision"), ("critic", "mixed_precision"), ("rollout", "dtype"))


def resolve_precision(
    cfg: TrainConfig, units: Bf16Units | None = None
) -> tuple[TrainConfig, list[str]]:
    """``cfg`` with every ``auto`` precision decided, and one line per decision saying what
    it became and why. ``units``: this machine's, measured when needed."""
    notes = []
    for section, key in AUTO_KEYS:
        group = getattr(cfg, section)
        if getattr(group, key) != AUTO:
            continue
        units = units or Bf16Units.here()
        on_gpu = (
            group.num_gpus_per_worker if section == "rollout" else group.num_gpus_per_rank
        ) > 0
        bf16, reason = (units.gpu, units.gpu_reason) if on_gpu else (units.cpu, units.cpu_reason)
        if section == "rollout":
            label = "bfloat16" if bf16 else f"null ({cfg.model.dtype})"
        elif cfg.model.dtype != "float32":
            bf16, label = False, "null"
            reason = f"model.dtype={cfg.model.dtype}: mixed precision needs fp32 master weights"
        else:
            label = "bfloat16" if bf16 else "null (fp32)"
        value = "bfloat16" if bf16 else None
        cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(group, **{key: value})})
        notes.append(f"{section}.{key}=auto -> {label}: {reason}")
    return cfg, notes
