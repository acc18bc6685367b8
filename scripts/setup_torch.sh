#!/usr/bin/env bash
# Install torch==VERSION, the CPU build, into the active Python environment (scripts/setup.sh's
# torch step on machines without a GPU; tests/unit/test_setup.py drives it with local indexes).
#   1. RLSYS_TORCH_INDEX=url set: install from that index and nothing else is tried.
#   2. Else PyTorch's CPU wheel index (RLSYS_TORCH_CPU_INDEX, default below), asked for
#      VERSION+cpu, if it answers within 5 s.
#   3. Else pip's own index. Where that serves only a CUDA build (PyPI's Linux wheel), it is
#      installed anyway with a warning of its size: a CUDA build of torch runs on a CPU.
# Usage: bash scripts/setup_torch.sh VERSION
set -euo pipefail
VERSION="$1"
CPU_INDEX="${RLSYS_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

# "cpu", "cuda <release>" or "none": the build of the torch this environment imports.
torch_build() {
  python - "$VERSION" <<'PY' 2>/dev/null || echo none
import sys
try:
    import torch
except ImportError:
    print("none")
    raise SystemExit
if torch.__version__.split("+")[0] != sys.argv[1]:
    print("none")
else:
    print(f"cuda {torch.version.cuda}" if torch.version.cuda else "cpu")
PY
}

# Whether an index answers within 5 s (no retries: an unreachable host fails in ms here).
reachable() {
  python - "$1" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=5).close()
except Exception as error:  # DNS, refused, timeout, HTTP error: all mean "not this index"
    print(f"{type(error).__name__}: {error}", file=sys.stderr)
    raise SystemExit(1)
PY
}

if [ "$(torch_build)" = cpu ]; then
  echo "setup: torch $VERSION (CPU build) is already installed"
  exit 0
fi
if [ -n "${RLSYS_TORCH_INDEX:-}" ]; then
  echo "setup: torch $VERSION from RLSYS_TORCH_INDEX=$RLSYS_TORCH_INDEX"
  python -m pip install -q --index-url "$RLSYS_TORCH_INDEX" "torch==$VERSION"
elif why=$(reachable "$CPU_INDEX" 2>&1); then
  echo "setup: torch $VERSION+cpu from PyTorch's CPU wheel index ($CPU_INDEX)"
  python -m pip install -q --extra-index-url "$CPU_INDEX" "torch==$VERSION+cpu"
else
  echo "setup: PyTorch's CPU wheel index ($CPU_INDEX) did not answer ($why); using pip's own index"
  python -m pip install -q "torch==$VERSION"
fi

build="$(torch_build)"
case "$build" in
  cpu) echo "setup: torch $VERSION, CPU build" ;;
  cuda*)
    size=$(python - <<'PY'
import pathlib, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
parts = [site / "torch", *site.glob("nvidia*"), *site.glob("triton")]
total = sum(f.stat().st_size for p in parts if p.exists() for f in p.rglob("*") if f.is_file())
print(f"{total / 2**30:.1f} GiB")
PY
)
    cat >&2 <<EOF
setup: WARNING: only a CUDA build of torch $VERSION (CUDA ${build#cuda }) could be installed:
setup: WARNING: $size on disk with its NVIDIA libraries, instead of ~0.7 GiB for the CPU build.
setup: WARNING: It runs on this CPU all the same. For the CPU build, point RLSYS_TORCH_INDEX at
setup: WARNING: a CPU wheel index (PyTorch's: $CPU_INDEX) and rerun scripts/setup.sh.
EOF
    ;;
  *) echo "setup: torch $VERSION did not install; see pip's output above" >&2
     exit 1 ;;
esac
