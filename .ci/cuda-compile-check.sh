#!/usr/bin/env bash
# Compile-checks every CUDA kernel of kda-cuda with NVRTC 12.8 for sm_80 and sm_90 — no GPU, no
# CUDA toolkit needed. NVRTC comes from PyPI (the `nvidia-cuda-nvrtc-cu12` wheel, matching
# cudarc's `cuda-12080` feature), installed with `pip install --target` into a cache directory
# outside the repository (reused on later runs; set KDA_NVRTC_DIR to choose it). The kernels
# include no header, so the runtime-headers wheel is not needed.
#
# Fails (non-zero exit) on any compile error or warning, on a kernel missing from the PTX, or on
# a forbidden register spill; prints PTX/CUBIN sizes and per-kernel register use.
set -euo pipefail
cd "$(dirname "$0")/.."

NVRTC_VERSION="12.8.93"
DIR="${KDA_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kda-cuda/nvidia-cuda-nvrtc-cu12-$NVRTC_VERSION}"
LIB="$DIR/nvidia/cuda_nvrtc/lib"

if [ ! -e "$LIB/libnvrtc.so.12" ]; then
    PYTHON="${PYTHON:-python3}"
    echo "installing nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION into $DIR"
    tmp="$DIR.partial.$$"
    rm -rf "$tmp"
    mkdir -p "$(dirname "$DIR")"
    PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --no-compile \
        --target "$tmp" "nvidia-cuda-nvrtc-cu12==$NVRTC_VERSION"
    rm -rf "$DIR"
    mv "$tmp" "$DIR"
fi
test -e "$LIB/libnvrtc.so.12" || { echo "error: $LIB/libnvrtc.so.12 missing after install" >&2; exit 1; }

# cudarc opens libnvrtc by its soname (libnvrtc.so.12 is one of its candidates); libnvrtc then
# opens libnvrtc-builtins.so.12.8 from the same directory.
export LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo run --quiet -p kda-cuda --example compile_check -- sm_80 sm_90
