#!/usr/bin/env bash
# The Python package kda-py: builds its wheel with maturin (the abi3 wheel, one file for every
# CPython >= 3.9: the artefact users install), installs that file into a cached venv and runs the
# pytest suite against it (kernels vs fla-core 0.6.0's naive references, the layer API, the
# transformers integration). The tested wheel is kept in $KDA_WHEEL_DIR (default target/wheels).
#
# The venv lives OUTSIDE the repository, at $KDA_PY_CACHE/venv-<hash>, where the hash covers
# the pinned requirement files and the Python version: a run with the same pins reuses it, so
# after the first run this step only rebuilds the extension and runs pytest.
#
# torch: PyPI's Linux wheel of torch 2.15.0 is the CUDA build; it links libcublas, libcudnn,
# NCCL, ... at import time, even on a CPU-only machine. Installing torch with --no-deps
# (without the ~3 GB of nvidia-* wheels) was measured to fail at `import torch`
# ("libcublasLt.so.*[0-9] not found"), and the CPU-only wheels live on download.pytorch.org,
# which CI cannot reach (registries only). So the full wheel set is installed once and cached;
# pip's own download cache (~/.cache/pip) makes a rebuild of the venv after a pin change cheap.
# triton comes with torch: fla/ops/kda/gate.py imports it at module level.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
CACHE=${KDA_PY_CACHE:-$HOME/.cache/kda-py}
key=$(cat kda-py/requirements-ci.txt kda-py/requirements-fla.txt <("$PY" -VV) | sha256sum | cut -c1-16)
VENV="$CACHE/venv-$key"

if [ ! -f "$VENV/.complete" ]; then
    echo "creating the Python test venv $VENV (first run: downloads torch and its CUDA wheels)"
    rm -rf "$VENV"
    mkdir -p "$CACHE"
    start=$(date +%s)
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -r kda-py/requirements-ci.txt
    "$VENV/bin/python" -m pip install --quiet --no-deps -r kda-py/requirements-fla.txt
    touch "$VENV/.complete"
    echo "venv ready in $(($(date +%s) - start)) s"
    # Venvs of older pins are ~6 GB each: keep only this one.
    find "$CACHE" -maxdepth 1 -name 'venv-*' ! -name "venv-$key" -exec rm -rf {} +
fi

WHEEL_DIR=${KDA_WHEEL_DIR:-target/wheels}

# One release build of the wheel (the workspace's target/ serves cargo), into a fresh folder so
# no older wheel can be picked up; its name must carry the abi3 tag.
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
"$VENV/bin/maturin" build --release --manifest-path kda-py/Cargo.toml \
    --interpreter "$VENV/bin/python" --out "$build"
wheels=("$build"/*.whl)
if [ "${#wheels[@]}" -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
    echo "error: maturin wrote ${#wheels[@]} wheels to $build, expected one" >&2
    exit 1
fi
wheel=${wheels[0]}
case "$(basename "$wheel")" in
    *-abi3-*) ;;
    *)
        echo "error: $(basename "$wheel") is not an abi3 wheel (pyo3's abi3-py39 feature)" >&2
        exit 1
        ;;
esac
"$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheel"

# pytest exits 5 when it collects no tests: with `set -e` that fails CI like any failure.
# Run from kda-py/tests so the installed package, not the source folder, is imported.
(cd kda-py/tests && "$VENV/bin/python" -m pytest -q -p no:cacheprovider .)

mkdir -p "$WHEEL_DIR"
cp "$wheel" "$WHEEL_DIR/"
echo "wheel: $WHEEL_DIR/$(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB), installed and tested"
