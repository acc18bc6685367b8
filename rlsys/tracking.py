"""Metric sinks: console line, metrics.jsonl (always), wandb and tensorboard (when enabled)."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from rlsys.config.schema import TrackingConfig
from rlsys.run_dir import trim_metrics

_CONSOLE_KEYS = [
    ("rollout/reward_mean", "reward", "{:.3f}"),
    ("rollout/accuracy", "acc", "{:.3f}"),
    ("train/loss", "loss", "{:+.4f}"),
    ("train/kl", "kl", "{:.4f}"),
    ("train/entropy", "ent", "{:.3f}"),
    ("train/grad_norm", "gnorm", "{:.3f}"),
    ("rollout/response_tokens", "len", "{:.1f}"),
    ("eval/accuracy", "EVAL", "{:.3f}"),
    ("perf/step_s", "step_s", "{:.2f}"),
    ("perf/tokens_per_s", "tok/s", "{:.0f}"),
]


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Tracker:
    """Writes every logged step to each enabled sink."""

    def __init__(
        self,
        run_dir: Path,
        cfg: TrackingConfig,
        run_name: str,
        config: dict,
        total_steps: int | None = None,
        prefix: str = "",
        run_id: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.total_steps = total_steps
        self.prefix = prefix
        self.run_dir = run_dir
        self._jsonl = (run_dir / "metrics.jsonl").open("a")
        self._wandb = None
        self._tb = None
        if cfg.wandb:
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb_project,
                name=run_name,
                config=config,
                dir=str(run_dir),
                mode=cfg.wandb_mode,
                reinit=True,
                id=run_id,  # a resumed run continues its wandb run
                resume="allow" if run_id else None,
            )
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    @property
    def run_id(self) -> str | None:
        """The wandb run id (saved in checkpoints so a resumed run continues it)."""
        return self._wandb.id if self._wandb is not None else None

    def rewind(self, last_step: int) -> None:
        """Forget metrics.jsonl records after ``last_step``: a resumed or recovered run logs
        those steps again (wandb and tensorboard keep theirs)."""
        self._jsonl.close()
        trim_metrics(self.run_dir, last_step)
        self._jsonl = (self.run_dir / "metrics.jsonl").open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record ``metrics`` for ``step`` everywhere."""
        record = {
            "step": step,
            "time": time.time(),
            **{k: _jsonable(v) for k, v in metrics.items()},
        }
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)
        if self.cfg.console:
            print(self.format_line(step, metrics), file=sys.stderr, flush=True)

    def format_line(self, step: int, metrics: dict[str, float]) -> str:
        """A one-line human summary of a step."""
        total = f"/{self.total_steps}" if self.total_steps else ""
        parts = [f"{self.prefix}step {step}{total}"]
        for key, label, fmt in _CONSOLE_KEYS:
            if key in metrics and metrics[key] is not None:
                parts.append(f"{label} {fmt.format(metrics[key])}")
        stages = [
            f"{k.removeprefix('time/')} {v:.2f}"
            for k, v in metrics.items()
            if k.startswith("time/")
        ]
        if stages:
            parts.append("(" + ", ".join(stages) + ")")
        return " | ".join(parts)

    def close(self) -> None:
        self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()
