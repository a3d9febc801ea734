#!/usr/bin/env bash
# Embedded CI for kda (issue 6): kda-core on emulated microcontrollers.
#
# Builds the example firmware (embedded/firmware) for a Cortex-M3 (thumbv7m-none-eabi, soft
# float, QEMU mps2-an385) and a Cortex-M4F (thumbv7em-none-eabihf, QEMU mps2-an386), runs every
# binary under QEMU with semihosting and `-icount shift=0` (virtual time = instruction count),
# and has the host recompute the same layer with kda-core and compare (embedded/host). Fails on
# any output outside tolerance, a bad instruction-count calibration, a flash-data mismatch with
# the weight seed, or a float routine reachable from the integer decode step.
# Also builds kda-core with its `defmt` feature for thumbv7em. See embedded/README.md.
# Works on a clean Debian machine with package-registry access; installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$(date +%s)

step() { printf '\n=== embedded: %s\n' "$*"; }

step "toolchain"
rustup target add thumbv7em-none-eabihf thumbv7m-none-eabi
rustup component add llvm-tools >/dev/null 2>&1 || rustup component add llvm-tools-preview >/dev/null 2>&1 || true
SYSROOT=$(rustc --print sysroot)
HOST_TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
OBJDUMP="$SYSROOT/lib/rustlib/$HOST_TRIPLE/bin/llvm-objdump"
if [ ! -x "$OBJDUMP" ]; then
    OBJDUMP=$(command -v llvm-objdump || true)
fi
if ! command -v qemu-system-arm >/dev/null 2>&1 || [ -z "$OBJDUMP" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update
    PKGS="qemu-system-arm"
    [ -n "$OBJDUMP" ] || PKGS="$PKGS llvm"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends $PKGS
    [ -n "$OBJDUMP" ] || OBJDUMP=$(command -v llvm-objdump)
fi
export KDA_OBJDUMP="$OBJDUMP"
qemu-system-arm --version | head -1
"$OBJDUMP" --version | sed -n 2p || true

step "kda-core with defmt, thumbv7em-none-eabihf"
cargo build -p kda-core --target thumbv7em-none-eabihf --features defmt

cd "$ROOT/embedded"
step "fmt (embedded crates only: -p, so the path dependency kda-core is not touched)"
cargo fmt -p kda-embedded-model -p kda-embedded-firmware -p kda-embedded-gen -p kda-embedded-host -- --check

step "flash weights == generator output for the seed"
cargo run -q -p kda-embedded-gen -- --check

OUT="$ROOT/embedded/target/qemu"
rm -rf "$OUT"
mkdir -p "$OUT/m3" "$OUT/m4" "$OUT/m4-micromath"
BINS="kda-f32 kda-i8 kda-fixed kda-mathbench"

step "firmware: thumbv7m-none-eabi (Cortex-M3, soft float)"
cargo build --release -p kda-embedded-firmware --target thumbv7m-none-eabi
for b in $BINS; do cp "target/thumbv7m-none-eabi/release/$b" "$OUT/m3/"; done

step "firmware: thumbv7em-none-eabihf (Cortex-M4F)"
cargo build --release -p kda-embedded-firmware --target thumbv7em-none-eabihf
for b in $BINS; do cp "target/thumbv7em-none-eabihf/release/$b" "$OUT/m4/"; done
cargo build --release -p kda-embedded-firmware --target thumbv7em-none-eabihf --features micromath
for b in kda-f32 kda-i8 kda-mathbench; do cp "target/thumbv7em-none-eabihf/release/$b" "$OUT/m4-micromath/"; done

step "firmware with defmt logging (kda-core/defmt + defmt-semihosting; build and link only)"
cargo build --release -p kda-embedded-firmware --target thumbv7em-none-eabihf --features defmt

step "QEMU runs"
run() { # machine cpu elf log
    local rc=0
    timeout 120 qemu-system-arm -machine "$1" -cpu "$2" -nographic -monitor none -serial none \
        -semihosting-config enable=on,target=native -icount shift=0 -kernel "$3" >"$4" 2>&1 || rc=$?
    printf '%-40s exit %s, %s lines\n' "${3#"$OUT"/}" "$rc" "$(wc -l <"$4")"
}
RUNS=()
for b in $BINS; do
    v=${b#kda-}
    run mps2-an385 cortex-m3 "$OUT/m3/$b" "$OUT/m3/$b.log"
    RUNS+=("m3:$v:$OUT/m3/$b:$OUT/m3/$b.log")
    run mps2-an386 cortex-m4 "$OUT/m4/$b" "$OUT/m4/$b.log"
    RUNS+=("m4:$v:$OUT/m4/$b:$OUT/m4/$b.log")
done
for b in kda-f32 kda-i8 kda-mathbench; do
    v=${b#kda-}-micromath
    run mps2-an386 cortex-m4 "$OUT/m4-micromath/$b" "$OUT/m4-micromath/$b.log"
    RUNS+=("m4:$v:$OUT/m4-micromath/$b:$OUT/m4-micromath/$b.log")
done

step "compare with the host computation"
cargo run -q -p kda-embedded-host -- --report "$OUT/report.md" "${RUNS[@]}"

echo
echo "embedded CI: all steps passed in $(( $(date +%s) - START )) s"
