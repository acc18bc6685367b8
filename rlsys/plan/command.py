"""The ``rlsys plan`` command.

    rlsys plan calibrate RUN_DIR... [--out costs.json] [--host-cores N]
    rlsys plan predict --costs costs.json [--check RUN_DIR...] [--task-lengths SPEC] [key=value ...]
    rlsys plan --cluster nodes=8,gpus_per_node=8,gpu=H100 --model qwen2.5-7b --task-lengths SPEC
        [--costs costs.json] [--batch-size 512] [--n-samples 16] [--top 5]

``calibrate`` fits the cost model to finished runs and prints, for each run, the prediction
for its own config beside what it measured. ``predict`` simulates the ``rlsys train`` config
the overrides describe (or, with ``--check``, the given runs' configs, as a table against what
they measured). Without a sub-command, ``plan`` searches placements for a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlsys.plan.calibrate import Calibration, CalibrationError, calibrate, read_run
from rlsys.plan.costs import CostsError, read_costs
from rlsys.plan.predict import check_run, format_checks, predict_config
from rlsys.plan.workload import ReplyLengths, WorkloadError


def _calibrate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlsys plan calibrate", description="fit the cost model to finished runs"
    )
    p.add_argument("run_dirs", nargs="+", help="directories of finished `rlsys train` runs")
    p.add_argument("--out", help="write the calibration here (JSON; for --costs)")
    p.add_argument(
        "--host-cores",
        type=float,
        help="cores the pools shared (default: fitted to the asynchronous runs given, else "
        "cluster.num_cpus or this machine's)",
    )
    return p


def _predict_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rlsys plan predict",
        description="predict samples/s, idle fractions and staleness of an `rlsys train` config",
    )
    p.add_argument("--costs", required=True, help="a calibration from `rlsys plan calibrate`")
    p.add_argument(
        "--check", nargs="+", metavar="RUN_DIR", help="predict these runs' own configs and "
        "print the error table against what they measured (overrides are ignored)"
    )  # fmt: skip
    p.add_argument("--task-lengths", help="reply lengths: N | N1,N2,... | mean=M,max=X")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for rlsys train")
    return p


def _load_calibration(path: str) -> Calibration:
    costs, data = read_costs(path)
    measured = data.get("measured", {})
    return Calibration(
        costs=costs,
        identified=data.get("identified", {}),
        fit_error=data.get("fit_error", {}),
        reply_lengths=measured.get("reply_lengths", [1]),
        weight_bytes=measured.get("weight_bytes", 0.0),
        filtered_frac=measured.get("filtered_frac", 0.0),
        runs=data.get("runs", []),
    )


def run_calibrate(argv: list[str]) -> int:
    args = _calibrate_parser().parse_args(argv)
    runs = [read_run(d) for d in args.run_dirs]
    cal = calibrate(runs, args.host_cores)
    print(json.dumps({"costs": cal.costs.to_dict(), "identified": cal.identified}, indent=2))
    print("\nthe calibration's predictions for its own runs:")
    print(format_checks([check_run(cal, run) for run in runs]))
    if args.out:
        Path(args.out).write_text(json.dumps(cal.to_json(), indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


def run_predict(argv: list[str]) -> int:
    args = _predict_parser().parse_args(argv)
    cal = _load_calibration(args.costs)
    if args.check:
        print(format_checks([check_run(cal, read_run(d)) for d in args.check]))
        return 0
    from rlsys.config import ConfigError
    from rlsys.resolve import load_config

    try:
        cfg = load_config(args.overrides)
    except ConfigError as exc:
        print(f"rlsys plan predict: config error: {exc}", file=sys.stderr)
        return 2
    lengths = ReplyLengths.parse(args.task_lengths) if args.task_lengths else None
    pred = predict_config(cal, cfg, lengths)
    print(
        json.dumps(
            {
                "samples_per_s": round(pred.samples_per_s, 2),
                "step_s": round(pred.step_s, 4),
                "rollout_idle_frac": round(pred.rollout_idle_frac, 3),
                "learner_idle_frac": round(pred.learner_idle_frac, 3),
                "staleness": {str(k): round(v, 3) for k, v in pred.staleness.items()},
                "dropped": pred.dropped,
                "steps": pred.steps,
                "wall_s": round(pred.wall_s, 2),
            },
            indent=2,
        )
    )
    return 0


def run_search(argv: list[str]) -> int:
    from rlsys.plan.search import main as search_main

    return search_main(argv)


def main(argv: list[str]) -> int:
    """``rlsys plan <calibrate|predict|--cluster ...>``; exit 2 on bad input, naming it."""
    commands = {"calibrate": run_calibrate, "predict": run_predict}
    try:
        if argv and argv[0] in commands:
            return commands[argv[0]](argv[1:])
        return run_search(argv)
    except (CalibrationError, CostsError, WorkloadError) as exc:
        print(f"rlsys plan: {exc}", file=sys.stderr)
        return 2
