#!/usr/bin/env bash
# Instructions per decode token and per prefill chunk, counted under QEMU user mode (issue 16).
#
#   tests/scripts/count_insns.sh [--arch aarch64|x86_64] [--isa LIST] [--out FILE]
#
# Builds the probe (tests/src/bin/insn_probe.rs, release) for the architecture and the QEMU
# plugin (tests/qemu-insn/insn_count.c), runs the probe under qemu-ARCH with the plugin for two
# values of N per workload, and reports (count(N2) − count(N1)) / (N2 − N1): weight
# generation, start-up and first-call costs cancel. LIST is comma-separated ISA names for the
# probe (default "portable,best"; "best" is whatever the emulated CPU's best path is, so a
# duplicate of an earlier column is dropped). Prints a Markdown table; --out also writes it.
#
# Needs: gcc, qemu-user (7.2+, with plugin support), and for aarch64 the cross linker
# gcc-aarch64-linux-gnu with libc6-dev-arm64-cross (.ci/aarch64.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

ARCH=aarch64
ISAS=portable,best
OUT_FILE=""
while [ $# -gt 0 ]; do
    case "$1" in
    --arch) ARCH=$2; shift 2 ;;
    --isa) ISAS=$2; shift 2 ;;
    --out) OUT_FILE=$2; shift 2 ;;
    *) echo "count_insns.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

case "$ARCH" in
aarch64)
    TRIPLE=aarch64-unknown-linux-gnu
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    QEMU=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
    ;;
x86_64)
    TRIPLE=x86_64-unknown-linux-gnu
    QEMU=(qemu-x86_64 -cpu max)
    ;;
*) echo "count_insns.sh: --arch must be aarch64 or x86_64" >&2; exit 2 ;;
esac

# The two values of N per workload.
DECODE_N=(1 3)
PREFILL_N=(2 6)

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORK="$TARGET_DIR/qemu-insn"
rm -f "$WORK"/*.count "$WORK"/*.log
mkdir -p "$WORK"
PLUGIN="$WORK/insn_count.so"
gcc -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
    -o "$PLUGIN" tests/qemu-insn/insn_count.c
cargo build -q --release -p kda-conformance --bin insn_probe --target "$TRIPLE"
PROBE="$TARGET_DIR/$TRIPLE/release/insn_probe"

# count ISA WORKLOAD N: prints the instructions of one probe run; leaves its stdout in $WORK.
# Fails (with the probe's output) when the probe fails or the plugin wrote no count.
count() {
    local log="$WORK/$1-$2-$3.log" cnt="$WORK/$1-$2-$3.count" n
    rm -f "$cnt"
    if ! "${QEMU[@]}" -plugin "$PLUGIN,out=$cnt" "$PROBE" "$1" "$2" "$3" >"$log" 2>&1; then
        echo "count_insns.sh: the probe failed: $1 $2 $3" >&2
        cat "$log" >&2
        return 1
    fi
    n=$(sed -n 's/^insns \([0-9][0-9]*\)$/\1/p' "$cnt" 2>/dev/null || true)
    if [ -z "$n" ]; then
        echo "count_insns.sh: the plugin wrote no count for $1 $2 $3 ($cnt)" >&2
        return 1
    fi
    echo "$n"
}

# per_unit ISA WORKLOAD N-ARRAY: instructions per unit by differencing two runs.
per_unit() {
    local -n ns=$3
    local a b
    a=$(count "$1" "$2" "${ns[0]}") || return 1
    b=$(count "$1" "$2" "${ns[1]}") || return 1
    echo $(((b - a) / (ns[1] - ns[0])))
}

field() { sed -n "s/^$2 //p" "$1" | head -1; }

declare -A SEEN=()
ROWS=()
IFS=, read -r -a ISA_LIST <<<"$ISAS"
for isa in "${ISA_LIST[@]}"; do
    # The path's own name, from a cheap run (so "best" is not counted twice).
    name=$("${QEMU[@]}" "$PROBE" "$isa" prefill 1 2>/dev/null | sed -n 's/^isa \([^ ]*\).*/\1/p') || true
    if [ -z "$name" ]; then
        "${QEMU[@]}" "$PROBE" "$isa" prefill 1 >&2 || true
        echo "count_insns.sh: no path named $isa on this CPU" >&2
        exit 1
    fi
    if [ -n "${SEEN[$name]:-}" ]; then
        echo "($isa is $name on this CPU: already counted)"
        continue
    fi
    SEEN[$name]=1
    dec=$(per_unit "$isa" decode DECODE_N) || exit 1
    decr=$(per_unit "$isa" decode-rows DECODE_N) || exit 1
    pre=$(per_unit "$isa" prefill PREFILL_N) || exit 1
    dlog="$WORK/$isa-decode-${DECODE_N[0]}.log"
    plog="$WORK/$isa-prefill-${PREFILL_N[0]}.log"
    ROWS+=("$name|$dec|$decr|$pre|$(field "$dlog" flops_per_unit)|$(field "$dlog" bytes_per_unit)|$(field "$plog" flops_per_unit)|$(field "$plog" bytes_per_unit)")
done
echo "probe: $(field "$WORK/${ISA_LIST[0]}-decode-${DECODE_N[0]}.log" workload)"
echo "probe: $(field "$WORK/${ISA_LIST[0]}-prefill-${PREFILL_N[0]}.log" workload)"

table() {
    echo "| $ARCH path | decode: insns/token (panel layout) | decode: insns/token (row-major) | prefill: insns/chunk (1 head) | decode FLOPs/insn | prefill FLOPs/insn |"
    echo "|---|---:|---:|---:|---:|---:|"
    for r in "${ROWS[@]}"; do
        IFS='|' read -r name dec decr pre dflops _ pflops _ <<<"$r"
        awk -v n="$name" -v d="$dec" -v dr="$decr" -v p="$pre" -v df="$dflops" -v pf="$pflops" 'BEGIN {
            printf "| %s | %.4g M | %.4g M | %.4g M | %.2f | %.2f |\n", n, d / 1e6, dr / 1e6, p / 1e6, df / d, pf / p }'
    done
    IFS='|' read -r _ _ _ _ dflops dbytes pflops pbytes <<<"${ROWS[0]}"
    awk -v df="$dflops" -v db="$dbytes" -v pf="$pflops" -v pb="$pbytes" 'BEGIN {
        printf "\ndecode: %.4g MFLOP/token over %.4g MB/token (bf16 weights once + f32 state read and written) = %.2f FLOP/byte\n", df / 1e6, db / 1e6, df / db
        printf "prefill: %.4g MFLOP/chunk/head over %.4g kB/chunk/head (inputs, outputs, state) = %.1f FLOP/byte\n", pf / 1e6, pb / 1e3, pf / pb }'
}
table | tee "${OUT_FILE:-/dev/null}"
