#!/usr/bin/env bash
# Compile-checks every CUDA kernel of kda-cuda with NVRTC, no GPU and no CUDA toolkit needed:
#   - NVRTC 12.8 (the `nvidia-cuda-nvrtc-cu12` wheel) for sm_80 and sm_90;
#   - NVRTC 13.0 (the CUDA 13 `nvidia-cuda-nvrtc` wheel, the version of the H200 image) for sm_90
#     and sm_100.
# Each wheel is installed with `pip install --target` into a cache directory outside the
# repository (reused on later runs; KDA_NVRTC_CACHE chooses the parent folder). The kernels include
# no header, so the runtime-headers wheels are not needed.
#
# The two runs also exercise kda-cuda's library discovery (src/libs.rs): the 12.8 run names the
# wheel's lib folder in KDA_CUDA_LIB_DIR, the 13.0 run names only the `site-packages`-like install
# folder in KDA_CUDA_PYTHON_SITE (the library is then found in its nvidia/cu13/lib), and each run
# fails unless that exact NVRTC version was loaded (KDA_EXPECT_NVRTC).
#
# Fails (non-zero exit) on any compile error or warning, on a kernel missing from the PTX, or on
# a forbidden register spill; prints PTX/CUBIN sizes and per-kernel register use. Last, it checks
# that no driver / NVRTC / cuBLAS entry point the executables reach is missing from CUDA 12
# (kda-cuda/scripts/cuda12-symbols.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${KDA_NVRTC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kda-cuda}"
PYTHON="${PYTHON:-python3}"

# install PACKAGE VERSION LIBFILE -> prints the install folder (installs once, atomically)
install() {
    local pkg=$1 version=$2 lib=$3
    local dir="$CACHE/$pkg-$version"
    if [ ! -e "$dir/$lib" ]; then
        echo "installing $pkg==$version into $dir" >&2
        local tmp="$dir.partial.$$"
        rm -rf "$tmp"
        mkdir -p "$CACHE"
        PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --disable-pip-version-check \
            --no-deps --no-compile --target "$tmp" "$pkg==$version" >&2
        rm -rf "$dir"
        mv "$tmp" "$dir"
    fi
    test -e "$dir/$lib" || { echo "error: $dir/$lib missing after install" >&2; exit 1; }
    echo "$dir"
}

cargo build --quiet -p kda-cuda --example compile_check
BIN=target/debug/examples/compile_check

echo "--- NVRTC 12.8: sm_80 sm_90"
dir12=$(install nvidia-cuda-nvrtc-cu12 12.8.93 nvidia/cuda_nvrtc/lib/libnvrtc.so.12)
env -u LD_LIBRARY_PATH -u KDA_CUDA_PYTHON_SITE KDA_EXPECT_NVRTC=12.8 \
    KDA_CUDA_LIB_DIR="$dir12/nvidia/cuda_nvrtc/lib" "$BIN" sm_80 sm_90

echo "--- NVRTC 13.0: sm_90 sm_100"
dir13=$(install nvidia-cuda-nvrtc 13.0.88 nvidia/cu13/lib/libnvrtc.so.13)
env -u LD_LIBRARY_PATH -u KDA_CUDA_LIB_DIR KDA_EXPECT_NVRTC=13.0 \
    KDA_CUDA_PYTHON_SITE="$dir13" "$BIN" sm_90 sm_100

echo "--- CUDA 12 compatibility of the CUDA 13.0 bindings: entry points the executables reach"
bash kda-cuda/scripts/cuda12-symbols.sh
