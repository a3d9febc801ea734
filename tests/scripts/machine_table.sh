#!/usr/bin/env bash
# One command for a machine class's performance figures (README "Performance", issue 13): what
# this CPU is, then each figure the issue asks for next to the limit measured in the same run,
# and torch side by side when a Python with torch and fla-core is given.
#
#   tests/scripts/machine_table.sh [--rounds N] [--python PY] [--no-criterion] [--out FILE]
#
# * the CPU: model, cores, and which of avx2 / fma / avx512f / avx512_bf16 it has;
# * criterion `projection` (kda-core): the projection GEMM 1024 × 2304 × 4096 with bf16 weights
#   and the FMA peak measured in the same run (target ≥ 85 % of it), and the K3-sized decode
#   GEMV against the read reference;
# * N rounds (default 3; the log keeps every run), each running every case below once and then
#   the torch side by side, so that each ratio is taken within one round. `kda bench` (kda-host):
#   Kimi Linear prefill T = 1024 at 1 and 2 threads (vs the FMA peak; 1 → 2 threads ≥ 1.8×),
#   Kimi Linear decode, Kimi K3 decode batch 1 at 1 and 2 threads (vs the read reference,
#   target ≥ 92 %; also step by step against read passes run between the steps, the
#   "decode vs read passes interleaved" line), Kimi K3 decode batch 16 (GFLOP/s vs peak);
#   on a CPU with avx512_bf16 the
#   same prefill and decode cases in the bf16 precision mode (--precision bf16); on a CPU with
#   avx512f, the prefill on the AVX2 path too (--isa avx2, against the 256-bit FMA peak);
# * with --python PY (a Python that imports torch and fla-core, e.g. kda-py's CI venv under
#   ~/.cache/kda-py): tests/scripts/bench_torch.py at 1 and 2 threads in every round (the side
#   by side: prefill ≥ 2× torch's f32 layer, K3 decode ≥ 1.1× torch's bf16 layer), and, once at
#   the end if PY also imports kda, kda-py/bench/bench_kda.py (chunk_kda vs fla's and
#   transformers' references, in rounds; decode overhead).
#
# Nothing here is a pass/fail check: it prints the figures (and writes them to FILE, default
# target/machine-table.log) for the README's table of this machine class (Performance; the
# runs behind it in PERFORMANCE.md). Run it on an idle machine: shared VMs move by 10-20 %
# between runs, hence the rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=3
PY=""
CRITERION=1
OUT=target/machine-table.log
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift 2 ;;
        --python) PY=$2; shift 2 ;;
        --no-criterion) CRITERION=0; shift ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "unknown argument: $1 (see the comment at the top of $0)" >&2; exit 2 ;;
    esac
done
mkdir -p "$(dirname "$OUT")"
exec > >(tee "$OUT") 2>&1

section() { printf '\n## %s\n\n' "$*"; }

section "machine ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|L1d|L2|L3)' || true
echo "features: $(grep -o -w -E 'avx2|fma|avx512f|avx512bw|avx512vl|avx512_bf16|avx512_fp16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"

section "build"
cargo build --release -p kda-host --bin kda 2>&1 | tail -1
KDA=target/release/kda

if [ "$CRITERION" = 1 ]; then
    section "criterion: projection GEMM and decode GEMV vs the FMA peak / read reference"
    # Each benchmark's name, time and throughput (not criterion's progress or change lines).
    cargo bench -p kda-core --bench projection 2>&1 |
        awk '/^ISA/ {print}
             /^[a-z_0-9]+\/[a-z_0-9]+ *$/ {name=$1; n=0}
             /^[a-z_0-9]+\/[a-z_0-9]+ +time:/ {name=$1; n=1; print}
             /^ +(time|thrpt):/ && n<2 && name!="" {print name ": " $0; n++}' || true
fi

run_case() {
    local label=$1 r=$2
    shift 2
    echo "### $label (round $r/$ROUNDS): kda bench $*"
    "$KDA" bench "$@" 2>&1 | grep -E 'ISA|bandwidth|prefill|decode' || true
}

TORCH=0
if [ -n "$PY" ]; then
    if "$PY" -c 'import torch, fla' 2>/dev/null; then
        TORCH=1
    else
        echo "skipped: $PY does not import torch and fla (tests/scripts/requirements.txt)"
    fi
else
    echo "skipped: torch side by side (give --python PY, a Python with torch and fla-core)"
fi

# Round by round, torch's side by side in the same round as kda's cases: this shared VM's
# speed moves between minutes, so a ratio is taken within one round.
for r in $(seq 1 "$ROUNDS"); do
    section "round $r/$ROUNDS: kda bench"
    run_case "Kimi Linear prefill T=1024, 1 thread" "$r" --preset kimi-linear --prompt 1024 --steps 8 --threads 1
    run_case "Kimi Linear prefill T=1024, 2 threads" "$r" --preset kimi-linear --prompt 1024 --steps 8 --threads 2
    run_case "Kimi Linear decode, batch 1, 1 thread" "$r" --preset kimi-linear --prompt 16 --steps 64 --threads 1
    run_case "Kimi K3 decode, batch 1, 1 thread" "$r" --preset kimi-k3 --prompt 16 --steps 32 --threads 1
    run_case "Kimi K3 decode, batch 1, 2 threads" "$r" --preset kimi-k3 --prompt 16 --steps 32 --threads 2
    run_case "Kimi K3 decode, batch 16, 1 thread" "$r" --preset kimi-k3 --prompt 16 --steps 16 --batch 16 --threads 1
    if grep -q -w avx512_bf16 /proc/cpuinfo; then
        run_case "bf16 mode: Kimi Linear prefill T=1024, 1 thread" "$r" --preset kimi-linear --prompt 1024 --steps 8 --threads 1 --precision bf16
        run_case "bf16 mode: Kimi Linear prefill T=1024, 2 threads" "$r" --preset kimi-linear --prompt 1024 --steps 8 --threads 2 --precision bf16
        run_case "bf16 mode: Kimi K3 decode, batch 1, 1 thread" "$r" --preset kimi-k3 --prompt 16 --steps 32 --threads 1 --precision bf16
        run_case "bf16 mode: Kimi K3 decode, batch 16, 1 thread" "$r" --preset kimi-k3 --prompt 16 --steps 16 --batch 16 --threads 1 --precision bf16
    elif [ "$r" = 1 ]; then
        echo "skipped: bf16 mode cases (no avx512_bf16; the mode runs emulated here, slower than exact)"
    fi
    if grep -q -w avx512f /proc/cpuinfo; then
        # The AVX2 kernels on an AVX-512 machine, against the 256-bit FMA peak: a slowdown of
        # the AVX2 path shows here too, not only on AVX2-only machines (from 4dcfb45 on
        # 2026-12-03 the prefill GEMM ran at 40 % of the AVX2 peak unnoticed until 38caf6d on Zen 3).
        run_case "AVX2 path: Kimi Linear prefill T=1024, 1 thread" "$r" --preset kimi-linear --prompt 1024 --steps 8 --threads 1 --isa avx2
    fi
    if [ "$TORCH" = 1 ]; then
        for t in 1 2; do
            section "round $r/$ROUNDS: torch side by side, $t thread(s) (tests/scripts/bench_torch.py)"
            MALLOC_MMAP_MAX_=0 OMP_NUM_THREADS=$t "$PY" tests/scripts/bench_torch.py --threads "$t" 2>&1 |
                grep -v -i warn || true
        done
    fi
done

if [ -n "$PY" ]; then
    if "$PY" -c 'import kda, torch, fla, transformers' 2>/dev/null; then
        section "Python package (kda-py/bench/bench_kda.py)"
        "$PY" kda-py/bench/bench_kda.py 2>&1 | grep -v -i warn || true
    else
        echo "skipped: $PY does not import kda, torch, fla and transformers (pip install ./kda-py)"
    fi
fi

echo
echo "figures written to $OUT"
