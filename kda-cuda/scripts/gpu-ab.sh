#!/bin/bash
# One device call that checks a kernel change and times it against a base build.
#
# Prepare (on a machine with Rust, in the checkout the device tool sends):
#   kda-cuda/scripts/gpu-check.sh --build-only target/gpu-prebuilt          # this branch
#   git worktree add /tmp/kda-base main && (cd /tmp/kda-base &&
#     cargo build --release -p kda-cuda --example bench) &&
#     mkdir -p .whl && cp /tmp/kda-base/target/release/examples/bench .whl/bench-base
#   (optional, for fla's kernels beside ours: copy fla-core 0.6.0's `fla` package to .whl/site/fla)
# Run (device tool):
#   run(command="OUT=$OUT bash kda-cuda/scripts/gpu-ab.sh", carry=["target/gpu-prebuilt", ".whl"],
#       timeout_s=420)
# Prints the check's steps and speed rows, the chunked rows at chunk 32 and 16, per-kernel times
# (ncu, gpu__time_duration) for this build and the base into $OUT/ncu_{new,base}.csv, and fla's
# fused_recurrent_kda decode on the same GPU, then builds and runs scripts/mma_probe.cu with the
# machine's nvcc (tensor-core fragment layout, TF32 / 3xTF32 / SIMT accuracy and speed on the state
# pass's product shape). About 3 minutes.
set -o pipefail
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
