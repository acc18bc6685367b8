"""The ``rlsys`` command: ``rlsys <train|sft|rm|dpo|eval|submit> [--cfg job] [key=value ...]``.

Overrides are Hydra overrides (``learner.world_size=1``, ``algorithm=grpo``). The config is
validated before anything heavy is imported or started, so a bad key fails in about a second.
``rlsys plan`` predicts throughput from a cost model calibrated on runs and searches
placements for a cluster (docs/planning.md). ``rlsys submit launcher=<ray_job|kuberay|slurm>``
sends ``rlsys train`` with the same overrides to a cluster; ``status`` / ``stop`` follow the job; ``scale`` resizes a running
run's rollout pool or learner group; ``report`` plots a run's metrics; ``doctor [--gpu]``
checks this machine's stack with short real runs and writes a report to attach to a bug (exit 1
if a check failed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys

COMMANDS = {
    "train": "RL training (warm start, GRPO on Ray, evals); prints the summary.json path",
    "sft": "supervised fine-tuning on the learner backend",
    "rm": "train a Bradley-Terry reward model on preference pairs (for reward.model.paths)",
    "dpo": "DPO / IPO / conservative DPO of the policy on preference pairs",
    "eval": "greedy held-out accuracy of model.path on task",
}
EXPORT_HELP = "write a checkpoint's policy as a Hugging Face directory (no Ray, no learners)"
SUBMIT_HELP = "submit `rlsys train <overrides>` with launcher=ray_job|kuberay|slurm (or local)"
JOB_COMMANDS = {
    "status": "print the state of a submitted job (give the same launcher overrides)",
    "stop": "stop a submitted job (the run checkpoints on SIGTERM)",
}
SCALE_HELP = (
    "resize a live run's pools after its current step: rlsys scale RUN_DIR rollout=N "
    "learner=M [critic=K]; exit 2 if no process holds RUN_DIR/.lock or a size is past the "
    "run's bounds (autoscale range, the cluster in RUN_DIR/cluster.json)"
)
REPORT_HELP = "plot a run's metrics.jsonl: RUN_DIR/report/index.html and a PNG per panel"
PLAN_HELP = (
    "predict samples/s, idle fractions and staleness: plan calibrate RUN_DIR... | plan predict "
    "--costs F [overrides] | plan --cluster nodes=N,gpus_per_node=G,gpu=H100 --model qwen2.5-7b "
    "(ranked placements); see docs/planning.md"
)
DOCTOR_HELP = (
    "check this machine: versions, a 2-step training run, weight-sync timing (--gpu: the GPU "
    "half too); writes doctor.md and doctor.json; exit 1 if a check failed (skips are not)"
)


PREEMPTED_EXIT = 143  # 128 + SIGTERM: the shell's code for "terminated", so schedulers requeue
INTERRUPTED_EXIT = 130  # 128 + SIGINT: stopped by Ctrl-C


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlsys", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("--cfg", choices=["job"], help="print the resolved config and exit")
        cmd.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data.batch_size=16")
    submit = sub.add_parser("submit", help=SUBMIT_HELP, description=SUBMIT_HELP)
    submit.add_argument(
        "--dry-run", action="store_true", help="print what would be submitted; submit nothing"
    )
    submit.add_argument("overrides", nargs="*", help="Hydra overrides, as for rlsys train")
    for name, help_text in JOB_COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("job_id", help="the id `rlsys submit` printed")
        cmd.add_argument("overrides", nargs="*", help="launcher=... cluster.address=... etc.")
    scale = sub.add_parser("scale", help=SCALE_HELP, description=SCALE_HELP)
    scale.add_argument("run_dir", help="the live run's directory (config.yaml, .lock)")
    scale.add_argument("targets", nargs="+", help="pool=size, e.g. rollout=4 learner=2")
    export = sub.add_parser("export", help=EXPORT_HELP, description=EXPORT_HELP)
    export.add_argument("checkpoint", help="a run's checkpoints/step_<N> (or its policy/)")
    export.add_argument("out_dir", help="where the Hugging Face directory goes")
    export.add_argument(
        "--merge",
        action="store_true",
        help="a LoRA run: write the model with the adapters merged in (default: the PEFT "
        "adapter directory alone, to load on the base model)",
    )
    report = sub.add_parser("report", help=REPORT_HELP, description=REPORT_HELP)
    report.add_argument("run_dir", help="the run's directory (it holds metrics.jsonl)")
    plan = sub.add_parser("plan", help=PLAN_HELP, description=PLAN_HELP, add_help=False)
    plan.add_argument("args", nargs=argparse.REMAINDER, help="see `rlsys plan --help`")
    doctor = sub.add_parser("doctor", help=DOCTOR_HELP, description=DOCTOR_HELP)
    doctor.add_argument(
        "--gpu",
        action="store_true",
        help="add the GPU half: device probe, pytest -m gpu, a vLLM GRPO run on GPU, NCCL / "
        "CUDA IPC weight sync (each skipped, saying so, where no CUDA device is visible)",
    )
    doctor.add_argument("--out", help="report directory (default outputs/doctor-<timestamp>)")
    doctor.add_argument(
        "--timeout", type=float, default=900.0, help="seconds each check may take (default 900)"
    )
    doctor.add_argument("--checks", help="run only these checks (comma-separated names)")
    return parser


def _export(checkpoint: str, out_dir: str, merge: bool) -> int:
    from rlsys.checkpoint.store import CheckpointError
    from rlsys.commands.export import export_policy

    try:
        print(f"exported: {export_policy(checkpoint, out_dir, merge)}")
    except CheckpointError as exc:
        print(f"rlsys export: {exc}", file=sys.stderr)
        return 2
    return 0


def _scale(run_dir: str, targets: list[str]) -> int:
    from rlsys.trainers.rl.scale_requests import ScaleError, request_scale

    try:
        print(request_scale(run_dir, targets))
    except ScaleError as exc:
        print(f"rlsys scale: {exc}", file=sys.stderr)
        return 2
    return 0


def _report(run_dir: str) -> int:
    from rlsys.run.report import ReportError, write_report

    try:
        print(f"report: {write_report(run_dir)}")
    except ReportError as exc:
        print(f"rlsys report: {exc}", file=sys.stderr)
        return 2
    return 0


def _doctor(args, argv: list[str]) -> int:
    from rlsys.run.doctor import DoctorError, main

    try:
        return main(args.gpu, args.out, args.timeout, args.checks, argv)
    except DoctorError as exc:
        print(f"rlsys doctor: {exc}", file=sys.stderr)
        return 2


def _launch(args, cfg) -> int:
    """``submit`` / ``status`` / ``stop`` through the launcher ``launcher.kind`` names."""
    from rlsys.config import ConfigError
    from rlsys.launch import LAUNCHERS, LaunchError

    launcher = LAUNCHERS.get(cfg.launcher.kind)()
    try:
        if args.command == "submit":
            return launcher.submit(cfg, list(args.overrides), args.dry_run)
        if args.command == "status":
            return launcher.status(cfg, args.job_id)
        return launcher.stop(cfg, args.job_id)
    except ConfigError as exc:  # the run does not fit what the launcher renders
        print(f"rlsys {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except LaunchError as exc:
        print(f"rlsys {args.command}: {exc}", file=sys.stderr)
        return 2


def _parse(argv: list[str]) -> argparse.Namespace:
    """Parse, with flags accepted anywhere among the overrides: argparse alone takes the
    overrides as one run of positionals, so ``submit launcher=kuberay --dry-run x=1`` left
    ``x=1`` unrecognized. Overrides after a flag join the others, in order."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides"):
        flags = [item for item in extra if item.startswith("-")]
        if not flags:
            args.overrides = [*args.overrides, *extra]
            return args
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plan"]:  # its own sub-commands and options (rlsys.plan.command)
        from rlsys.plan.command import main as plan_main

        return plan_main(argv[1:])
    args = _parse(argv)
    if args.command == "export":
        return _export(args.checkpoint, args.out_dir, args.merge)
    if args.command == "scale":
        return _scale(args.run_dir, args.targets)
    if args.command == "report":
        return _report(args.run_dir)
    if args.command == "doctor":
        return _doctor(args, argv[1:])
    from rlsys.config import ConfigError
    from rlsys.config.loader import to_yaml
    from rlsys.resolve import load_config

    logging.basicConfig(  # before the config is read: it logs what `auto` settings became
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    try:
        program = "train" if args.command in ("submit", *JOB_COMMANDS) else args.command
        cfg = load_config(args.overrides, program=program)
    except ConfigError as exc:
        print(f"rlsys {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    if args.command in ("submit", *JOB_COMMANDS):
        return _launch(args, cfg)
    if args.cfg == "job":
        print(to_yaml(cfg), end="")
        return 0
    from rlsys.launch.local import preflight
    from rlsys.placement.resources import Roles

    try:
        preflight(cfg, Roles.for_rl(cfg) if args.command == "train" else Roles())
    except ConfigError as exc:
        print(f"rlsys {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    from rlsys.checkpoint.store import CheckpointError
    from rlsys.run.lock import RunDirInUse
    from rlsys.runtime import quiet_libraries

    quiet_libraries()
    try:
        if args.command == "train":
            from rlsys.commands.train import train

            path = train(cfg)
            print(f"summary: {path}")
            summary = json.loads(path.read_text())
            if summary["preempted"]:
                signame = summary.get("stopped_by") or "SIGTERM"
                print(
                    f"rlsys train: stopped by {signame} after step {summary['steps']}; "
                    f"checkpoint {summary['last_checkpoint']}. Run the same command with "
                    "resume=auto to continue.",
                    file=sys.stderr,
                )
                return INTERRUPTED_EXIT if signame == "SIGINT" else PREEMPTED_EXIT
        elif args.command == "sft":
            from rlsys.commands.sft import sft

            print(f"summary: {sft(cfg)}")
        elif args.command in ("rm", "dpo"):
            from rlsys.commands import preference

            print(f"summary: {getattr(preference, args.command)(cfg)}")
        else:
            from rlsys.commands.evaluate import evaluate

            print(json.dumps(evaluate(cfg), indent=2))
    except RunDirInUse as exc:  # another run owns the directory: not a config mistake
        print(f"rlsys {args.command}: {exc}", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"rlsys {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    except CheckpointError as exc:
        print(f"rlsys {args.command}: checkpoint error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            f"rlsys {args.command}: interrupted (no checkpoint was written after the last "
            "saved one)",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT
    return 0


def entry() -> None:
    """The ``rlsys`` command: ``main``, then the process's exit. After Ctrl-C the exit is
    immediate (``os._exit``) once the local Ray this process started is stopped: start-up
    threads can still be inside Ray calls (pools half started), and letting the interpreter
    tear Ray down under them segfaulted (rc -11 in 2 of 12 interrupts around pool start)."""
    code = main()
    if code == INTERRUPTED_EXIT and "ray" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        _stop_local_ray()
        os._exit(code)
    sys.exit(code)


def _stop_local_ray() -> None:
    """Kill the node processes of a local Ray this process started (a cluster it joined
    keeps running: its actors of this job end when the driver's connection drops)."""
    node = getattr(getattr(sys.modules["ray"], "_private", None), "worker", None)
    node = getattr(node, "_global_node", None)
    if node is None or not getattr(node, "head", False):
        return
    with contextlib.suppress(Exception):  # exiting anyway; leftovers die with their parent
        node.kill_all_processes(check_alive=False, allow_graceful=True)


if __name__ == "__main__":
    entry()
