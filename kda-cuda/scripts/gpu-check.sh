#!/usr/bin/env bash
# GPU verification of kda-cuda, for a machine with an NVIDIA GPU (sm_80 or newer recommended).
# Within 8 minutes it:
#   1. builds the workspace in release mode,
#   2. runs `cargo test --workspace` with the GPU present — kda-cuda's tests/gpu.rs then compare
#      every kernel path with the CPU backend (decode, recurrent and chunked prefill, packed
#      sequences with empty and 1-token sequences, −1000-scale gates, bf16 I/O, chunk-size
#      independence, device-resident caches through the KdaBackend trait), f32 rel-RMS ≤ 1e-4 and
#      bf16 ≤ 5e-3 — and prints those tests' rel-RMS table,
#   3. benchmarks prefill (T = 8192, H = 96, K = 128, bf16; packed variable lengths) and decode
#      (batch 1 and 64) and prints a table.
#
# Needs, besides the driver (libcuda): libnvrtc.so.12 and libcublas.so.12. They are taken from
# $KDA_CUDA_LIB_DIRS (colon-separated), the loader's cache, $CUDA_HOME or /usr/local/cuda, or the
# `nvidia-*-cu12` wheels of the active Python; failing that they are pip-installed (network) into a
# cache directory outside the repository.
#
# Usage: kda-cuda/scripts/gpu-check.sh        (from anywhere; exit status non-zero on any failure)
set -uo pipefail
cd "$(dirname "$0")/../.."
START=$SECONDS
BUDGET=${KDA_GPU_CHECK_BUDGET:-470}   # seconds; leaves margin under 8 minutes
left() { echo $(( BUDGET - (SECONDS - START) )); }
step() { printf '\n=== %s (%ds left)\n' "$*" "$(left)"; }
status=0

step "device"
if ! nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader && ! nvidia-smi -L; then
    echo "nvidia-smi failed: is there a GPU and a driver?"; exit 1
fi

step "CUDA libraries"
have() { # $1 = soname: found on LD_LIBRARY_PATH dirs or in the loader cache
    local d
    IFS=: read -ra dirs <<< "${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}"; do [ -n "$d" ] && [ -e "$d/$1" ] && return 0; done
    ldconfig -p 2>/dev/null | grep -q "$1"
}
add_dir() { [ -d "$1" ] && export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; }
[ -n "${KDA_CUDA_LIB_DIRS:-}" ] && export LD_LIBRARY_PATH="$KDA_CUDA_LIB_DIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for lib in libnvrtc.so.12 libcublas.so.12; do
    have "$lib" && continue
    for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 /usr/local/cuda-12*/lib64; do
        [ -e "$d/$lib" ] && { add_dir "$d"; break; }
    done
    have "$lib" && continue
    site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
    for s in $site; do
        for d in "$s"/nvidia/cuda_nvrtc/lib "$s"/nvidia/cublas/lib; do
            [ -e "$d/$lib" ] && add_dir "$d"
        done
    done
done
if ! have libnvrtc.so.12 || ! have libcublas.so.12; then
    CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kda-cuda/gpu-libs-12.8"
    if [ ! -e "$CACHE/nvidia/cublas/lib/libcublas.so.12" ]; then
        echo "pip-installing NVRTC 12.8 and cuBLAS 12.8 into $CACHE"
        PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$CACHE" \
            "nvidia-cuda-nvrtc-cu12==12.8.93" "nvidia-cublas-cu12==12.8.4.1" || {
            echo "error: libnvrtc/libcublas not found and pip install failed"; exit 1; }
    fi
    add_dir "$CACHE/nvidia/cuda_nvrtc/lib"
    add_dir "$CACHE/nvidia/cublas/lib"
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

step "build (release)"
timeout 230 cargo build --release --workspace --all-targets || { echo "build FAILED"; exit 1; }

step "cargo test --workspace (release, GPU present)"
# The host emulator is the CPU-only stand-in for these GPU checks; skip it here.
export KDA_CUDA_SKIP_EMULATOR=1
if ! timeout $(( $(left) - 100 )) cargo test --release --workspace; then
    echo "tests FAILED"; status=1
fi

step "GPU conformance detail (kda-cuda/tests/gpu.rs)"
if ! timeout $(( $(left) - 90 )) cargo test --release -p kda-cuda --test gpu -- --nocapture --test-threads=1 2>&1 \
    | grep -E "rel-RMS|out [0-9]|^cuda:|skipped|panicked|test result"; then
    status=1
fi

step "benchmark"
quick=()
[ "$(left)" -lt 150 ] && quick=(--quick)
if ! timeout $(( $(left) > 10 ? $(left) : 10 )) cargo run --release -p kda-cuda --example bench -- "${quick[@]}"; then
    echo "benchmark FAILED"; status=1
fi

printf '\ngpu-check: %s in %ds\n' "$([ $status -eq 0 ] && echo OK || echo FAILED)" $(( SECONDS - START ))
exit $status
