#!/usr/bin/env bash
# Set up (scripts/setup.sh), lint, then run the test suite; print how long each part took.
#   bash scripts/test.sh           the default tiers: tests/unit, tests/security,
#                                  tests/distributed, tests/e2e
#                                  without the `long` marker (what CI runs)
#   bash scripts/test.sh --long    the long tier: full-length demos and examples (-m long)
# Other arguments go to pytest. Fails when pytest fails or collects no tests (exit code 5).
# The last line lists every skipped test and why (with CI=true only GPU tests may skip).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
args=()
for arg in "$@"; do
  if [ "$arg" = --long ]; then args+=(-m long); else args+=("$arg"); fi
done
bash scripts/setup.sh
setup_s=$SECONDS
# shellcheck disable=SC1091
. "${RLSYS_VENV:-.venv}/bin/activate"
ruff check .
ruff format --check .
lint-imports  # the layering contract in pyproject.toml (docs/architecture.md)
lint_s=$((SECONDS - setup_s))
skips="$(mktemp)"
trap 'rm -f "$skips"' EXIT
set +e
RLSYS_SKIP_REPORT="$skips" python -m pytest --durations=30 "${args[@]}"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
fi
echo "test.sh: set-up ${setup_s} s, lint ${lint_s} s, pytest $((SECONDS - setup_s - lint_s)) s," \
  "total ${SECONDS} s (pytest exit code $code)"
echo "test.sh: skipped tests: $(wc -l <"$skips"): $(paste -sd ';' "$skips" | sed 's/;/; /g')"
exit "$code"
