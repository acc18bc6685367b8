"""Predictions for ``rlsys train`` configs from a calibration, and their check against runs
(``rlsys plan predict``)."""

from __future__ import annotations

from dataclasses import dataclass

from rlsys.config.schema import TrainConfig
from rlsys.plan.calibrate import Calibration, RunRecord
from rlsys.plan.simulator import Prediction, simulate
from rlsys.plan.workload import ReplyLengths, from_train_config

COMPARED = ("samples_per_s", "rollout_idle_frac", "learner_idle_frac")


def predict_config(
    calibration: Calibration, cfg: TrainConfig, lengths: ReplyLengths | None = None, seed: int = 0
) -> Prediction:
    """Simulate the run ``cfg`` describes with the calibrated costs (reply lengths: ``lengths``,
    else those measured in the calibration runs)."""
    workload, placement = from_train_config(
        cfg,
        lengths or calibration.lengths,
        weight_bytes=calibration.weight_bytes,
        filtered_frac=calibration.filtered_frac,
    )
    return simulate(calibration.costs, workload, placement, seed)


@dataclass
class Check:
    """A run's measured figures beside the prediction for its config."""

    run: str
    max_staleness: int
    measured: dict[str, float]
    predicted: dict[str, float]

    def error(self, key: str) -> float:
        """Relative error of the predicted ``key`` (absolute for idle fractions: a relative
        error of a fraction near 0 says nothing)."""
        p, m = self.predicted[key], self.measured[key]
        if key.endswith("_frac"):
            return p - m
        return (p - m) / m


def check_run(calibration: Calibration, run: RunRecord) -> Check:
    """Predict ``run``'s own config and set it beside what the run measured."""
    pred = predict_config(calibration, run.cfg)
    return Check(
        run=str(run.run_dir),
        max_staleness=run.cfg.buffer.max_staleness,
        measured=run.measured(),
        predicted={
            "samples_per_s": pred.samples_per_s,
            "rollout_idle_frac": pred.rollout_idle_frac,
            "learner_idle_frac": pred.learner_idle_frac,
            "staleness_mean": pred.staleness_mean,
        },
    )


def format_checks(checks: list[Check]) -> str:
    """A Markdown table of measured vs predicted figures."""
    lines = [
        "| run | max_staleness | samples/s measured | predicted | error | rollout idle "
        "measured | predicted | learner idle measured | predicted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        m, p = c.measured, c.predicted
        lines.append(
            f"| {c.run} | {c.max_staleness} | {m['samples_per_s']:.1f} | "
            f"{p['samples_per_s']:.1f} | {c.error('samples_per_s'):+.1%} | "
            f"{m['rollout_idle_frac']:.2f} | {p['rollout_idle_frac']:.2f} | "
            f"{m['learner_idle_frac']:.2f} | {p['learner_idle_frac']:.2f} |"
        )
    return "\n".join(lines)
