"""The cost model's constants, fitted from run directories (``config.yaml`` + ``metrics.jsonl``
+ ``summary.json``): ``rlsys plan calibrate RUN_DIR...``.

Each stage's constants come from a least-squares fit of its per-step seconds on the work that
step did (one row per training step of every run given). A run whose work does not vary
cannot tell a per-call cost from a per-token one: a term enters the fit only when its column
varies independently of the terms before it (the first, most physical term of each stage --
per token -- otherwise carries everything). ``identified`` in the output says which terms the
runs pinned down; runs at different batch sizes, reply lengths or pool sizes identify more.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlsys.config import ConfigError
from rlsys.config.schema import TrainConfig
from rlsys.plan.costs import StageCosts
from rlsys.plan.workload import ReplyLengths
from rlsys.resolve import load_run_config

# stages the learner's step is made of (perf/step_s less these is the controller's own work)
STEP_STAGES = (
    "wait_for_batch",
    "learner_logprobs",
    "critic_values",
    "critic_train",
    "train",
    "gate_wait",
    "weight_sync",
    "engine_sleep",
    "engine_wake",
    "eval",
)
INDEPENDENT = 1e-2  # a column enters a fit if 1% of its norm is outside the earlier columns'


class CalibrationError(ValueError):
    """A run directory that cannot be calibrated from (the message names it and the fix)."""


@dataclass
class RunRecord:
    """What one finished run left: its config, its training steps' metrics, its summary."""

    run_dir: Path
    cfg: TrainConfig
    steps: list[dict]  # metrics.jsonl records of training steps (step >= 1)
    summary: dict

    def mean(self, key: str) -> float:
        values = [m[key] for m in self.steps if key in m]
        return float(np.mean(values)) if values else float("nan")

    def measured(self) -> dict[str, float]:
        """The figures ``scripts/bench_async.py`` reports for this run."""
        return {
            "samples_per_s": float(self.summary["trained_samples_per_s"]),
            "rollout_idle_frac": self.mean("pool/rollout_idle_frac"),
            "learner_idle_frac": self.mean("pool/learner_idle_frac"),
            "staleness_mean": self.mean("buffer/staleness_mean"),
        }


def read_run(run_dir: str | Path) -> RunRecord:
    """A finished run's directory; errors name the missing file."""
    run_dir = Path(run_dir)
    for name in ("config.yaml", "metrics.jsonl", "summary.json"):
        if not (run_dir / name).is_file():
            raise CalibrationError(
                f"{run_dir} holds no {name}: give the directory of a finished `rlsys train` run "
                "(run.output_dir/run.name)"
            )
    try:
        cfg = load_run_config(run_dir / "config.yaml")
    except ConfigError as exc:
        raise CalibrationError(f"{run_dir}/config.yaml: {exc}") from exc
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in records if m.get("step", 0) >= 1 and "perf/step_s" in m]
    if not steps:
        raise CalibrationError(f"{run_dir}/metrics.jsonl has no training step with perf/step_s")
    summary = json.loads((run_dir / "summary.json").read_text())
    return RunRecord(run_dir, cfg, steps, summary)


@dataclass
class Calibration:
    """Fitted costs and the workload figures measured alongside them."""

    costs: StageCosts
    identified: dict[str, list[str]]  # stage -> cost keys the runs pinned down
    fit_error: dict[str, float]  # stage -> relative RMS error of the fit per step
    reply_lengths: list[int]  # per-step mean reply lengths (samples' own are not logged)
    weight_bytes: float
    filtered_frac: float
    runs: list[dict] = field(default_factory=list)  # each run's dir and measured figures

    def to_json(self) -> dict:
        return {
            "costs": self.costs.to_dict(),
            "identified": self.identified,
            "fit_error": self.fit_error,
            "measured": {
                "reply_lengths": self.reply_lengths,
                "weight_bytes": self.weight_bytes,
                "filtered_frac": self.filtered_frac,
            },
            "runs": self.runs,
        }

    @property
    def lengths(self) -> ReplyLengths:
        return ReplyLengths(tuple(self.reply_lengths))


def fit_linear(rows: list[dict[str, float]], y: list[float], order: list[str]) -> dict[str, float]:
    """Non-negative least squares of ``y`` on the columns ``order`` names, taking a column only
    if it varies independently of those before it; returns the fitted coefficients (0 for the
    columns left out)."""
    target = np.asarray(y, dtype=float)
    kept: list[str] = []
    for name in order:
        col = np.array([r.get(name, 0.0) for r in rows], dtype=float)
        if not np.any(col):
            continue
        if kept:
            basis = np.array([[r.get(k, 0.0) for k in kept] for r in rows], dtype=float)
            coef, *_ = np.linalg.lstsq(basis, col, rcond=None)
            if np.linalg.norm(col - basis @ coef) < INDEPENDENT * np.linalg.norm(col):
                continue
        kept.append(name)
    coefs = dict.fromkeys(order, 0.0)
    while kept:  # drop a negative coefficient and refit (a tiny active-set NNLS)
        basis = np.array([[r.get(k, 0.0) for k in kept] for r in rows], dtype=float)
        sol, *_ = np.linalg.lstsq(basis, target, rcond=None)
        if (sol >= 0).all():
            coefs.update(zip(kept, (float(s) for s in sol), strict=True))
            break
        kept.pop(int(np.argmin(sol)))
    return coefs


def _rel_error(rows, y, coefs) -> float:
    pred = np.array([sum(coefs[k] * r.get(k, 0.0) for k in coefs) for r in rows])
    y = np.asarray(y, dtype=float)
    scale = float(np.mean(np.abs(y))) or 1.0
    return float(np.sqrt(np.mean((pred - y) ** 2)) / scale)


def _stage_rows(run: RunRecord) -> list[dict]:
    """Per training step: the work each stage did (see ``StageCosts``)."""
    cfg = run.cfg
    n, batch, workers = cfg.rollout.n_samples, cfg.data.batch_size, cfg.rollout.num_workers
    per_request = cfg.rollout.prompts_per_request or math.ceil(batch / workers)
    ranks = cfg.learner.world_size
    rows = []
    for m in run.steps:
        made = m.get("rollout/samples", 0)
        reply = m.get("rollout/response_tokens", 0.0)
        trained = m.get("buffer/groups_kept", batch) * n
        prompts = m.get("rollout/sampling_rounds", 1.0) * batch
        rows.append(
            {
                "metrics": m,
                "gen": {
                    "gen_token_s": made * reply,
                    "gen_sequence_s": made,
                    "gen_call_s": prompts / per_request,
                },
                "gen_y": m.get("time/generation", 0.0) * workers,
                "learner": {
                    "token_s": trained * reply / ranks,
                    "sample_s": trained / ranks,
                    "call_s": 1.0,
                },
                "epochs": cfg.learner.ppo_epochs,
                "sync": {"sync_byte_s": m.get("perf/weight_sync_bytes", 0.0), "sync_call_s": 1.0},
                "groups": made / n,
            }
        )
    return rows


def host_cores(run: RunRecord) -> int:
    """Cores the run's pools shared: 0 (none shared) when rollout or learner had GPUs, else
    ``cluster.num_cpus``, else this machine's cores (calibrate on the machine that ran it, or
    pass ``--host-cores``)."""
    cfg = run.cfg
    if cfg.rollout.num_gpus_per_worker > 0 or cfg.learner.num_gpus_per_rank > 0:
        return 0
    return cfg.cluster.num_cpus or os.cpu_count() or 1


def calibrate(runs: list[RunRecord], cores: float | None = None) -> Calibration:
    """Fit the cost model to ``runs``.

    Stage constants come from the synchronous runs among them (there the pools take turns, so
    each stage is timed without contention; from every run if none is synchronous). Where the
    pools share a machine's cores, how many of them the pools effectively get (the machine's,
    less what other processes take) is fitted to the asynchronous runs' samples/s, if any are
    given, else it is the machine's core count; ``cores`` sets it instead."""
    if not runs:
        raise CalibrationError("rlsys plan calibrate: give at least one run directory")
    sync = [run for run in runs if run.cfg.buffer.max_staleness == 0]
    fit = _fit_stages(sync or runs)
    overlapping = [run for run in runs if run.cfg.buffer.max_staleness > 0]
    shared = host_cores(runs[0])
    if cores is not None:
        fit.fitted["host_cores"] = cores
    elif shared and overlapping and sync:
        fit.fitted["host_cores"] = shared
        fit.fitted["host_cores"] = fit_host_cores(fit, overlapping, top=2.0 * shared)
        fit.identified["contention"] = ["host_cores"]
    else:
        fit.fitted["host_cores"] = shared
    return fit.calibration(runs)


@dataclass
class _Fit:
    """Constants fitted so far, per stage what the runs pinned down and the fits' errors."""

    fitted: dict[str, float]
    identified: dict[str, list[str]]
    errors: dict[str, float]
    fitted_from: list[RunRecord]

    def calibration(self, runs: list[RunRecord]) -> Calibration:
        fit_runs = self.fitted_from
        return Calibration(
            costs=StageCosts.from_dict(self.fitted),
            identified=self.identified,
            fit_error=self.errors,
            reply_lengths=[
                max(1, round(m["rollout/response_tokens"]))
                for run in fit_runs
                for m in run.steps
                if "rollout/response_tokens" in m
            ]
            or [1],
            weight_bytes=_mean([run.mean("perf/weight_sync_bytes") for run in fit_runs]),
            filtered_frac=_mean([_filtered_frac(run) for run in fit_runs]),
            runs=[{"run_dir": str(run.run_dir), **run.measured()} for run in runs],
        )


def fit_host_cores(fit: _Fit, runs: list[RunRecord], top: float) -> float:
    """The cores (between 1 and ``top``) at which the simulator's samples/s for ``runs``
    matches the measured, in the geometric mean (more cores never predict fewer samples/s,
    so bisection finds it)."""
    from rlsys.plan.simulator import simulate
    from rlsys.plan.workload import from_train_config

    base = fit.calibration(fit.fitted_from)

    def log_ratio(cores: float) -> float:
        costs = dataclasses.replace(base.costs, host_cores=cores)
        total = 0.0
        for run in runs:
            work, place = from_train_config(
                run.cfg, base.lengths, weight_bytes=base.weight_bytes,
                filtered_frac=base.filtered_frac,
            )  # fmt: skip
            predicted = simulate(costs, work, place).samples_per_s
            total += math.log(max(predicted, 1e-9) / run.measured()["samples_per_s"])
        return total / len(runs)

    lo, hi = 1.0, top
    if log_ratio(hi) <= 0:
        return hi
    if log_ratio(lo) >= 0:
        return lo
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if log_ratio(mid) < 0 else (lo, mid)
    return round((lo + hi) / 2, 3)


def _fit_stages(runs: list[RunRecord]) -> _Fit:
    """Each stage's constants from the per-step metrics of ``runs``."""
    rows = [row for run in runs for row in _stage_rows(run)]
    fitted: dict[str, float] = {}
    identified: dict[str, list[str]] = {}
    errors: dict[str, float] = {}

    def stage(name: str, xs: list[dict], ys: list[float], order: list[str], rename=None):
        pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y == y]
        if not pairs:
            return
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        coefs = fit_linear(xs, ys, order)
        errors[name] = _rel_error(xs, ys, coefs)
        names = {k: (rename(k) if rename else k) for k in coefs}
        fitted.update({names[k]: v for k, v in coefs.items()})
        identified[name] = [names[k] for k, v in coefs.items() if v > 0]

    stage("generation", [r["gen"] for r in rows], [r["gen_y"] for r in rows], list(rows[0]["gen"]))
    with_lp = [r for r in rows if "time/learner_logprobs" in r["metrics"]]
    order = ["token_s", "sample_s", "call_s"]
    stage(
        "logprobs",
        [r["learner"] for r in with_lp],
        [r["metrics"]["time/learner_logprobs"] for r in with_lp],
        order,
        lambda k: f"logprob_{k}",
    )
    trained = [r for r in rows if "time/train" in r["metrics"]]
    stage(
        "train",
        [r["learner"] for r in trained],
        [r["metrics"]["time/train"] / r["epochs"] for r in trained],
        order,
        lambda k: f"train_{k}",
    )
    synced = [r for r in rows if "time/weight_sync" in r["metrics"]]
    stage(
        "weight_sync",
        [r["sync"] for r in synced],
        [r["metrics"]["time/weight_sync"] for r in synced],
        ["sync_byte_s", "sync_call_s"],
    )
    stage(
        "scoring",
        [{"score_group_s": r["groups"]} for r in rows],
        [r["metrics"].get("time/scoring", 0.0) + r["metrics"].get("time/reference", 0.0)
         for r in rows],
        ["score_group_s"],
    )  # fmt: skip
    fitted.update(_controller_overheads(runs))
    return _Fit(fitted, identified, errors, runs)


def _controller_overheads(runs: list[RunRecord]) -> dict[str, float]:
    """The controller's own seconds: inside a step (perf/step_s less its timed stages),
    between steps (gaps between the metrics' timestamps), once per run (training wall time
    less the steps)."""
    inside, between, per_run, sleep, wake = [], [], [], [], []
    for run in runs:
        run_inside, run_between = [], []
        for prev, m in zip([None, *run.steps], run.steps, strict=False):
            timed = sum(m.get(f"time/{s}", 0.0) for s in STEP_STAGES)
            run_inside.append(max(m["perf/step_s"] - timed, 0.0))
            if prev is not None and "time" in m and "time" in prev:
                run_between.append(max(m["time"] - prev["time"] - m["perf/step_s"], 0.0))
        sleep += [m["time/engine_sleep"] for m in run.steps if "time/engine_sleep" in m]
        wake += [m["time/engine_wake"] for m in run.steps if "time/engine_wake" in m]
        inside += run_inside
        between += run_between
        compute = sum(m["perf/step_s"] - m.get("time/eval", 0.0) for m in run.steps)
        gaps = _mean(run_between) * (len(run.steps) - 1)
        per_run.append(max(float(run.summary["train_wall_s"]) - compute - gaps, 0.0))
    return {
        "step_overhead_s": _mean(inside),
        "between_steps_s": _mean(between),
        "run_overhead_s": _mean(per_run),
        "engine_sleep_s": _mean(sleep),
        "engine_wake_s": _mean(wake),
    }


def _filtered_frac(run: RunRecord) -> float:
    batch = run.cfg.data.batch_size
    fracs = [
        m.get("rollout/groups_filtered", 0.0) / (m["rollout/sampling_rounds"] * batch)
        for m in run.steps
        if m.get("rollout/sampling_rounds")
    ]
    return _mean(fracs)


def _mean(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return float(np.mean(values)) if values else 0.0
