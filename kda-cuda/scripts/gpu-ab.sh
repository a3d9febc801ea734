#!/bin/bash
# One run on a GPU machine that checks a kernel change and times it against a base build.
#
# Prepare, on a machine with Rust, in the checkout to be sent to the GPU machine (the change checked out):
#   kda-cuda/scripts/gpu-ab.sh --prepare BASE_REF [PYTHON]
# builds this checkout's prebuilt check into target/gpu-prebuilt, BASE_REF's bench (in a temporary
# git worktree) into .whl/bench-base, and copies fla-core's `fla` package from PYTHON's
# site-packages (a venv with fla-core 0.6.0, e.g. ~/.cache/kda-py/venv-*/bin/python) into
# .whl/site/fla for fla's kernels beside ours. `.whl/` must be ignored (.git/info/exclude).
# Run, on the GPU machine, in that checkout with target/gpu-prebuilt and .whl copied along (allow 480 s):
#   OUT=LOGDIR bash kda-cuda/scripts/gpu-ab.sh
# Prints the check's steps and speed rows, the chunked rows at chunk 32 and 16, per-kernel times
# (ncu, gpu__time_duration) for this build and the base into $OUT/ncu_{new,base}.csv, and fla's
# fused_recurrent_kda decode on the same GPU, then builds and runs scripts/mma_probe.cu with the
# machine's nvcc (tensor-core fragment layout, TF32 / 3xTF32 / SIMT accuracy and speed on the state
# pass's product shape). About 3 minutes.
set -o pipefail
if [ "${1:-}" = --prepare ]; then
    set -e
    base=${2:?usage: gpu-ab.sh --prepare BASE_REF [PYTHON]}
    root=$(git rev-parse --show-toplevel)
    cd "$root"
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    kda-cuda/scripts/gpu-check.sh --build-only target/gpu-prebuilt
    wt=$(mktemp -d)
    git worktree add --detach "$wt" "$base" > /dev/null
    (cd "$wt" && CARGO_TARGET_DIR="$root/target/gpu-ab-base" cargo build --release -p kda-cuda --example bench)
    git worktree remove --force "$wt"
    mkdir -p .whl
    cp target/gpu-ab-base/release/examples/bench .whl/bench-base
    strip .whl/bench-base 2> /dev/null || true  # debug info would take most of a 64 MiB copy
    if [ -n "${3:-}" ]; then
        site=$("$3" -c 'import fla, os; print(os.path.dirname(os.path.dirname(fla.__file__)))')
        rm -rf .whl/site && mkdir -p .whl/site && cp -r "$site/fla" .whl/site/
        find .whl/site -name __pycache__ -prune -exec rm -rf {} +
    fi
    du -sh target/gpu-prebuilt .whl
    echo 'next: copy the checkout with target/gpu-prebuilt and .whl to the GPU machine and run OUT=LOGDIR bash kda-cuda/scripts/gpu-ab.sh there (allow 480 s)'
    exit 0
fi
OUT=${OUT:-/tmp/gpu-ab}
mkdir -p "$OUT"
B=target/gpu-prebuilt/bin
KDA_GPU_CHECK_BUDGET=200 bash target/gpu-prebuilt/run --out "$OUT/check" > /dev/null 2>&1
echo "check rc=$?"
grep -E "^\| (nvrtc|gpu|layer_fixtures|device_vs_cpu|bench) \|" "$OUT/check/results.md"
grep -E "^\| (prefill|decode)" "$OUT/check/results.md"
for c in 32 16; do
    echo "--- chunk $c"
    timeout 60 "$B/bench" --quick --chunk $c 2>&1 | grep -E "^\| prefill"
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
for which in new base; do
    bin=$B/bench
    [ $which = base ] && bin=.whl/bench-base
    [ -n "$NCU" ] && [ -x "$bin" ] || continue
    timeout 100 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --page raw \
        -k regex:'kda_' --launch-count 120 "$bin" --quick > "$OUT/ncu_$which.csv" 2> "$OUT/ncu_$which.err"
    echo "ncu $which rc=$? lines=$(wc -l < "$OUT/ncu_$which.csv")"
done
if [ -d .whl/site/fla ]; then
    PYTHONPATH=$PWD/.whl/site PYTHONUNBUFFERED=1 timeout 120 python3 kda-cuda/scripts/fla_gpu_bench.py \
        --decode-only 2>&1 | tee "$OUT/fla_decode.log"
    echo "fla rc=$?"
fi
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
if [ -n "$NVCC" ]; then
    timeout 120 "$NVCC" -O3 -arch=sm_90 -o /tmp/mma_probe kda-cuda/scripts/mma_probe.cu &&
        timeout 60 /tmp/mma_probe 2>&1 | tee "$OUT/mma_probe.log"
    echo "mma probe rc=$?"
fi
