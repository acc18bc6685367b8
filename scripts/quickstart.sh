#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the default training job: the tiny model learns
# reversed 2-digit addition with GRPO on a local Ray. Extra arguments are Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. "${RLSYS_VENV:-.venv}/bin/activate"
exec rlsys train "$@"
