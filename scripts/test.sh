#!/usr/bin/env bash
# Set up (scripts/setup.sh), lint, then run the test suite. Extra arguments go to pytest.
# Fails when pytest fails or collects no tests (exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${RLSYS_VENV:-.venv}/bin/activate"
ruff check .
ruff format --check .
set +e
python -m pytest "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing" >&2
fi
exit "$code"
