#!/usr/bin/env bash
# Build a wheelhouse: the packages rlsys needs beyond torch and transformers, as wheels, for a
# machine that has those two but no package index (an air-gapped GPU box, a locked-down image).
#   bash scripts/wheelhouse.sh [DIR]      DIR defaults to .whl
#   PYTHON_VERSION=3.12                   the target's Python (default 3.12, the CUDA images')
#   RLSYS_VENV=path                       the venv whose tested versions are pinned (default .venv)
# Then, on the target, from a checkout of this repo (its files travel with DIR):
#   python3 -m pip install --no-index --no-deps --target /tmp/site DIR/*.whl
#   export PYTHONPATH=$PWD:/tmp/site      # rlsys from the checkout, the wheels beside it
#   python3 scripts/gpu_check.py          # or rlsys's CLI: python3 -m rlsys.cli train ...
# (`pip install --no-index --find-links DIR -e .` works too where every dependency of rlsys is
# in DIR or already installed; the list below is what a torch + transformers image lacks.)
#
# Pure-Python packages published only as source (antlr4-python3-runtime, deepspeed) are built
# into wheels here. Ray's wheel is repacked without ray/jars (31 MB of Java that Python never
# loads), which brings it from 72 MB to about 41 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
VENV="${RLSYS_VENV:-.venv}"
PY="$VENV/bin/python"
if [ ! -x "$PY" ]; then
  echo "wheelhouse: $VENV has no Python; run bash scripts/setup.sh first (its versions are pinned)" >&2
  exit 2
fi
# Binary wheels for the target's interpreter and platform, at the versions this venv tests.
BINARY=(ray hydra-core omegaconf jsonschema jsonschema-specifications referencing rpds-py
  pydantic pydantic-core annotated-types typing-inspection hjson math-verify
  latex2sympy2-extended)
# Published as source only: built into (pure-Python) wheels here.
SOURCE=(antlr4-python3-runtime deepspeed)

pinned() {  # NAME -> NAME==VERSION installed in the venv
  "$PY" - "$1" <<'EOF'
import importlib.metadata as md, sys
name = sys.argv[1]
try:
    print(f"{name}=={md.version(name)}")
except md.PackageNotFoundError:
    sys.exit(f"wheelhouse: {name} is not installed in the venv; run bash scripts/setup.sh")
EOF
}

mkdir -p "$DIR"
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
specs=()
for name in "${BINARY[@]}"; do specs+=("$(pinned "$name")"); done
echo "wheelhouse: downloading ${#specs[@]} wheels for CPython $PYTHON_VERSION into $DIR"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" \
  --implementation cp "${platforms[@]}" -d "$DIR" "${specs[@]}"
for name in "${SOURCE[@]}"; do
  spec="$(pinned "$name")"
  echo "wheelhouse: building $spec"
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DIR" "$spec"
done
"$PY" - "$DIR" <<'EOF'
"""Repack Ray's wheel without ray/jars (and drop them from its RECORD)."""
import pathlib, sys, zipfile

for wheel in pathlib.Path(sys.argv[1]).glob("ray-*.whl"):
    with zipfile.ZipFile(wheel) as src:
        names = [n for n in src.namelist() if not n.startswith("ray/jars/")]
        if len(names) == len(src.namelist()):
            continue  # repacked already
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
            for name in names:
                data = src.read(name)
                if name.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(x for x in lines if not x.startswith("ray/jars/")).encode()
                dst.writestr(src.getinfo(name), data)
    tmp.replace(wheel)
    print(f"wheelhouse: {wheel.name} repacked without ray/jars")
EOF
echo "wheelhouse: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
