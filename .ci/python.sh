#!/usr/bin/env bash
# The Python package kda-py: builds it with maturin into a cached venv and runs its pytest suite
# (kernels vs fla-core 0.6.0's naive references, the layer API, the transformers integration).
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

export PATH="$VENV/bin:$PATH"  # maturin, called by pip as the build backend

# Build and install the package the way users do (`pip install ./kda-py`), reusing the venv's
# maturin instead of an isolated build environment, and the workspace's target/ for cargo.
"$VENV/bin/python" -m pip install --quiet --no-build-isolation --force-reinstall --no-deps ./kda-py

# pytest exits 5 when it collects no tests: with `set -e` that fails CI like any failure.
# Run from kda-py/tests so the installed package, not the source folder, is imported.
(cd kda-py/tests && "$VENV/bin/python" -m pytest -q -p no:cacheprovider .)
