#!/usr/bin/env bash
# aarch64 CI for kda (issue 16): the kernels on 64-bit ARM, emulated.
#
# * Cross-builds for aarch64-unknown-linux-gnu (Debian's gcc-aarch64-linux-gnu links) and runs
#   under QEMU user mode every kda-core test and the conformance suite against the fla
#   fixtures (the every_layer_fixture table printed), on every kernel path the emulated CPU
#   (QEMU's "max": every ARMv8/v9 extension QEMU implements) supports.
# * Lints kda-core, kda-host and the conformance crate for aarch64 (clippy -D warnings), and
#   type-checks kda-core and kda-host for aarch64-apple-darwin (no Linux-only code in them).
# * Validates the QEMU instruction-count plugin (tests/qemu-insn/insn_count.c) against
#   valgrind on an x86-64 program, then counts instructions per decode token and per prefill
#   chunk on aarch64 (tests/scripts/count_insns.sh; the table is in the README).
#
# Works on a clean Debian machine with package-registry access; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$(date +%s)

step() { printf '\n=== aarch64: %s (%s s)\n' "$1" "$(($(date +%s) - START))"; }

step "toolchain"
PKGS=""
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || PKGS="$PKGS gcc-aarch64-linux-gnu"
[ -e /usr/aarch64-linux-gnu/lib/libc.so ] || PKGS="$PKGS libc6-dev-arm64-cross"
command -v qemu-aarch64 >/dev/null 2>&1 || PKGS="$PKGS qemu-user"
command -v gcc >/dev/null 2>&1 || PKGS="$PKGS gcc"
command -v valgrind >/dev/null 2>&1 || PKGS="$PKGS valgrind"
if [ -n "$PKGS" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends $PKGS
fi
rustup target add aarch64-unknown-linux-gnu aarch64-apple-darwin
qemu-aarch64 --version | head -1
aarch64-linux-gnu-gcc --version | head -1

TRIPLE=aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
LOGS="$TARGET_DIR/aarch64-ci"
mkdir -p "$LOGS"

step "kda-core tests under qemu-aarch64"
cargo test -p kda-core --target "$TRIPLE" -- --show-output >"$LOGS/kda-core.log" 2>&1 || {
    tail -60 "$LOGS/kda-core.log"
    exit 1
}
grep -E '^test result|^     Running|^   Doc-tests' "$LOGS/kda-core.log"
PATHS=$(grep -m1 -o 'paths tested: .*' "$LOGS/kda-core.log" || true)
echo "SIMD ${PATHS:-paths: (the kda-core tests printed no 'paths tested' line)}"
grep -q 'paths tested: .*Neon' "$LOGS/kda-core.log" || { echo "the NEON path did not run"; exit 1; }

step "conformance suite under qemu-aarch64"
cargo test -p kda-conformance --target "$TRIPLE" -- --skip every_layer_fixture \
    >"$LOGS/conformance.log" 2>&1 || {
    tail -60 "$LOGS/conformance.log"
    exit 1
}
grep -E '^test result|^     Running' "$LOGS/conformance.log"

step "conformance table under qemu-aarch64: every backend vs the fla fixtures"
cargo test -p kda-conformance --target "$TRIPLE" --test layer_fixtures -- --nocapture every_layer_fixture

step "clippy for aarch64 (cfg(target_arch) code the x86-64 clippy step never sees)"
cargo clippy -p kda-core -p kda-host -p kda-conformance --all-targets --target "$TRIPLE" -- -D warnings

step "cargo check for aarch64-apple-darwin: kda-core (no_std) and kda-host"
cargo check --target aarch64-apple-darwin -p kda-core
cargo check --target aarch64-apple-darwin -p kda-host

step "instruction counter: qemu-x86_64 + insn_count.so vs valgrind on the same x86-64 program"
WORK="$TARGET_DIR/qemu-insn"
mkdir -p "$WORK"
gcc -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden \
    -o "$WORK/insn_count.so" tests/qemu-insn/insn_count.c
gcc -O1 -static -Wall -Wextra -Werror -o "$WORK/validate" tests/qemu-insn/validate.c
qemu_count() {
    qemu-x86_64 -plugin "$WORK/insn_count.so,out=$WORK/validate.count" "$WORK/validate" "$1" >/dev/null
    sed -n 's/^insns //p' "$WORK/validate.count"
}
valgrind_count() {
    valgrind --tool=callgrind --callgrind-out-file="$WORK/validate.callgrind" \
        "$WORK/validate" "$1" 2>&1 >/dev/null | sed -n 's/.*Collected : *//p'
}
Q1=$(qemu_count 1000000)
Q3=$(qemu_count 3000000)
V1=$(valgrind_count 1000000)
V3=$(valgrind_count 3000000)
echo "whole runs, 1e6 / 3e6 iterations: qemu plugin $Q1 / $Q3, valgrind $V1 / $V3"
for c in "$Q1" "$Q3" "$V1" "$V3"; do
    [[ "$c" =~ ^[0-9]+$ ]] || { echo "a count is missing (plugin or valgrind failed)"; exit 1; }
done
awk -v q=$((Q3 - Q1)) -v v=$((V3 - V1)) 'BEGIN {
    printf "difference (the loop alone): qemu plugin %d, valgrind %d, relative gap %.2e\n", q, v, (q - v) / v
    if (q - v > v * 1e-3 || v - q > v * 1e-3) { print "instruction counter disagrees with valgrind"; exit 1 } }'

step "instructions per decode token and per prefill chunk on aarch64 (every path)"
bash tests/scripts/count_insns.sh --arch aarch64 --out "$LOGS/insn-counts.md"

echo
echo "aarch64 CI: all steps passed in $(($(date +%s) - START)) s"
