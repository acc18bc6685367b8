"""What a run does (``Workload``) and where it runs (``Placement``), as the simulator sees it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlsys.config.schema import TrainConfig


class WorkloadError(ValueError):
    """A workload or placement that cannot be simulated (the message names the input)."""


LENGTH_QUANTILES = 256  # a given distribution is kept as this many equally likely lengths


@dataclass(frozen=True)
class ReplyLengths:
    """Reply lengths in tokens, drawn uniformly (with replacement) from ``values``: measured
    lengths, or quantiles of a given distribution (``parse``)."""

    values: tuple[int, ...] = (4,)

    def __post_init__(self) -> None:
        if not self.values or min(self.values) < 1:
            raise WorkloadError(f"reply lengths {self.values[:8]!r} must be >= 1 token")

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    def draw(self, rng: np.random.Generator, count: int) -> np.ndarray:
        if len(self.values) == 1:
            return np.full(count, self.values[0], dtype=np.int64)
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=count)

    @classmethod
    def parse(cls, spec: str) -> ReplyLengths:
        """``"600"`` (every reply 600 tokens), ``"120,800,4096"`` (equally likely lengths) or
        ``"mean=600,max=4096[,sigma=1.0]"``: a log-normal of that mean (log-space spread
        ``sigma``), cut at ``max`` -- RL replies are skewed, a few run to the limit."""
        spec = spec.strip()
        try:
            if "=" not in spec:
                return cls(tuple(int(x) for x in spec.split(",")))
            keys = dict(part.split("=", 1) for part in spec.split(","))
            mean, top = float(keys.pop("mean")), int(keys.pop("max"))
            sigma = float(keys.pop("sigma", 1.0))
        except (ValueError, KeyError) as exc:
            raise WorkloadError(
                f"--task-lengths {spec!r}: give 'N', 'N1,N2,...' or 'mean=M,max=X[,sigma=S]'"
            ) from exc
        if keys:
            raise WorkloadError(f"--task-lengths {spec!r}: unknown key(s) {sorted(keys)}")
        if not 1 <= mean <= top:
            raise WorkloadError(f"--task-lengths {spec!r}: need 1 <= mean <= max")
        # quantiles of a standard normal (deterministic, no sampling noise in the plan)
        q = (np.arange(LENGTH_QUANTILES) + 0.5) / LENGTH_QUANTILES
        z = np.sqrt(2) * _erfinv(2 * q - 1)
        raw = np.exp(sigma * z)
        # scale so that the mean after the cut at ``top`` is ``mean`` (a few bisection steps)
        lo, hi = 1e-6, float(top)
        for _ in range(60):
            scale = (lo + hi) / 2
            if np.minimum(raw * scale, top).mean() < mean:
                lo = scale
            else:
                hi = scale
        lengths = np.clip(np.rint(raw * lo), 1, top).astype(int)
        return cls(tuple(int(x) for x in lengths))


def _erfinv(y: np.ndarray) -> np.ndarray:
    """The inverse error function (Giles' single-precision approximation, refined by two
    Newton steps: plenty for quantiles of a length distribution)."""
    w = -np.log((1 - y) * (1 + y))
    small = w < 5
    ws, wl = w - 2.5, np.sqrt(np.maximum(w, 5)) - 3
    ps = np.polyval(
        [2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
         -0.00125372503, -0.00417768164, 0.246640727, 1.50140941],
        ws,
    )  # fmt: skip
    pl = np.polyval(
        [-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
         -0.0076224613, 0.00943887047, 1.00167406, 2.83297682],
        wl,
    )  # fmt: skip
    x = np.where(small, ps, pl) * y
    erf = np.vectorize(math.erf)
    for _ in range(2):
        x = x - (erf(x) - y) / (2 / math.sqrt(math.pi) * np.exp(-x * x))
    return x


@dataclass(frozen=True)
class Workload:
    """One run's work: ``batch_size`` prompts per step, ``n_samples`` replies each."""

    batch_size: int = 32
    n_samples: int = 8
    lengths: ReplyLengths = field(default_factory=ReplyLengths)
    prompt_tokens: float = 0.0  # 0: unknown, folded into the per-sample costs
    total_steps: int = 20
    max_groups: int | None = None  # trainer.max_samples / n_samples
    ppo_epochs: int = 1
    mini_batches: int = 1
    needs_logprobs: bool = True  # a forward pass of its own before training
    weight_bytes: float = 0.0  # what a weight sync sends
    filtered_frac: float = 0.0  # groups the filter drops (e.g. no reward variance)
    draw_rounds: int = 1  # DAPO's max_sampling_rounds (dynamic sampling), else 1

    def __post_init__(self) -> None:
        for key in ("batch_size", "n_samples", "total_steps", "ppo_epochs", "mini_batches"):
            if getattr(self, key) < 1:
                raise WorkloadError(f"workload {key}={getattr(self, key)} must be >= 1")
        if not 0 <= self.filtered_frac < 1:
            raise WorkloadError(f"workload filtered_frac={self.filtered_frac} must be in [0, 1)")


@dataclass(frozen=True)
class Placement:
    """Pools and the staleness bound. ``colocated``: engines sleep while the learners train
    on the same devices (``placement.engine_sleep``); else each pool has its own."""

    rollout_workers: int = 1
    learner_ranks: int = 1
    max_staleness: int = 0
    partial: bool = False  # rollout.partial_rollouts
    colocated: bool = False
    prompts_per_request: int | None = None  # None: a batch spread over the workers
    engine_tp: int = 1  # GPUs per engine (tensor parallel); the costs are per engine

    def __post_init__(self) -> None:
        if self.rollout_workers < 1 or self.learner_ranks < 1:
            raise WorkloadError(
                f"placement needs >= 1 rollout worker and learner rank, got "
                f"{self.rollout_workers} and {self.learner_ranks}"
            )
        if self.max_staleness < 0:
            raise WorkloadError(f"placement max_staleness={self.max_staleness} must be >= 0")

    def per_request(self, batch_size: int) -> int:
        """Prompts per generation request (the pipeline's rule)."""
        return self.prompts_per_request or math.ceil(batch_size / self.rollout_workers)


def from_train_config(
    cfg: TrainConfig,
    lengths: ReplyLengths,
    prompt_tokens: float = 0.0,
    weight_bytes: float = 0.0,
    filtered_frac: float = 0.0,
) -> tuple[Workload, Placement]:
    """The workload and placement an ``rlsys train`` config describes."""
    from rlsys.algorithms.objectives import needs_old_logprobs  # imports torch: only here

    algo, learner = cfg.algorithm, cfg.learner
    budget = cfg.trainer.max_samples
    workload = Workload(
        batch_size=cfg.data.batch_size,
        n_samples=cfg.rollout.n_samples,
        lengths=lengths,
        prompt_tokens=prompt_tokens,
        total_steps=cfg.trainer.total_steps,
        max_groups=None if budget is None else math.ceil(budget / cfg.rollout.n_samples),
        ppo_epochs=learner.ppo_epochs,
        mini_batches=learner.num_mini_batches,
        needs_logprobs=needs_old_logprobs(
            learner.ppo_epochs, learner.num_mini_batches, algo.off_policy, algo.uses_reference
        ),
        weight_bytes=weight_bytes,
        filtered_frac=filtered_frac if algo.filter_uniform_groups else 0.0,
        draw_rounds=algo.max_sampling_rounds if algo.dynamic_sampling else 1,
    )
    placement = Placement(
        rollout_workers=cfg.rollout.num_workers,
        learner_ranks=cfg.learner.world_size,
        max_staleness=cfg.buffer.max_staleness,
        partial=cfg.rollout.partial_rollouts,
        colocated=cfg.engines_sleep,
        prompts_per_request=cfg.rollout.prompts_per_request,
    )
    return workload, placement
