"""The ``rlsys`` command: ``rlsys <train|sft|eval> [--cfg job] [key=value ...]``.

Overrides are Hydra overrides (``learner.world_size=1``, ``algorithm=grpo``). The config is
validated before anything heavy is imported or started, so a bad key fails in about a second.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

COMMANDS = {
    "train": "RL training (warm start, GRPO on Ray, evals); prints the summary.json path",
    "sft": "supervised fine-tuning on the learner backend",
    "eval": "greedy held-out accuracy of model.path on task",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlsys", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in COMMANDS.items():
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("--cfg", choices=["job"], help="print the resolved config and exit")
        cmd.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data.batch_size=16")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from rlsys.config import ConfigError
    from rlsys.config.loader import load_config, to_yaml

    try:
        cfg = load_config(args.overrides)
    except ConfigError as exc:
        print(f"rlsys {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    if args.cfg == "job":
        print(to_yaml(cfg), end="")
        return 0
    from rlsys.launch.local import preflight
    from rlsys.placement import Roles

    try:
        preflight(cfg, Roles.for_rl(cfg) if args.command == "train" else Roles())
    except ConfigError as exc:
        print(f"rlsys {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    from rlsys import app
    from rlsys.runtime import quiet_libraries

    quiet_libraries()
    try:
        if args.command == "train":
            print(f"summary: {app.train(cfg)}")
        elif args.command == "sft":
            print(f"summary: {app.sft(cfg)}")
        else:
            print(json.dumps(app.evaluate(cfg), indent=2))
    except ConfigError as exc:
        print(f"rlsys {args.command}: config error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
