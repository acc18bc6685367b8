"""Convert a GSM8K or MATH-style dataset file into rows for ``task.name=file``.

    python scripts/preprocess_math.py --input gsm8k_train.jsonl --output data/gsm8k/train.jsonl
    python scripts/preprocess_math.py --input math_train.parquet --format math \\
        --output data/math/train.parquet --eval-fraction 0.05 --eval-output data/math/eval.jsonl

Reads .jsonl, .json or .parquet; writes .jsonl or .parquet rows ``{"prompt", "answer", ...}``
(see ``rlsys.data.math_data``). Rows that cannot be converted are skipped and counted. With
``--eval-fraction`` a seeded random share of the rows goes to ``--eval-output`` instead. Then
train with ``task=gsm8k task.train_path=OUT [task.eval_path=EVAL]`` (or ``task=math``).
"""

from __future__ import annotations

import argparse
import sys

from rlsys.data.math_data import FORMATS, convert_rows, read_rows, split_rows, write_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", required=True, help=".jsonl, .json or .parquet")
    parser.add_argument("--format", default="auto", choices=["auto", *sorted(FORMATS)])
    parser.add_argument("--output", required=True, help=".jsonl or .parquet")
    parser.add_argument("--eval-fraction", type=float, default=0.0, help="share held out, [0, 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the eval split's shuffle")
    parser.add_argument("--eval-output", help=".jsonl or .parquet for the held-out rows")
    args = parser.parse_args(argv)
    if not 0.0 <= args.eval_fraction < 1.0:
        parser.error(f"--eval-fraction={args.eval_fraction} must be in [0, 1)")
    if (args.eval_fraction > 0) != (args.eval_output is not None):
        parser.error("--eval-fraction and --eval-output go together; give both or neither")
    try:
        result = convert_rows(read_rows(args.input), args.format)
        if not result.rows:
            raise ValueError(f"no row of {args.input!r} could be converted as {result.format}")
        train, held = split_rows(result.rows, args.eval_fraction, args.seed)
        outputs = [(write_rows(train, args.output), len(train))]
        if args.eval_output:
            outputs.append((write_rows(held, args.eval_output), len(held)))
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"format: {result.format}; converted: {len(result.rows)}; skipped: {result.skipped}")
    for path, count in outputs:
        print(f"wrote {count} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
