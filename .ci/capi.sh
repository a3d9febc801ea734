#!/usr/bin/env bash
# C API CI (issue 17): kda-capi's header, static libraries, and the C programs that use them.
#
# 1. kda.h is what cbindgen generates from kda-capi/src (no diff).
# 2. kda-capi builds as a no_std staticlib for thumbv7em-none-eabihf and thumbv7m-none-eabi, and
#    its panic-free lints hold there (clippy on the no_std build); its Rust tests pass.
# 3. The host C example (plain `cc`, linking libkda_capi.a) loads each exported layer from a flat
#    file, runs prefill + decode (or the integer path), and prints every output: the text must
#    equal, byte for byte, what the Rust API computed for the same file (bitwise outputs).
# 4. The C status tests provoke every status code from C.
# 5. The C firmware (arm-none-eabi-gcc + newlib-nano, semihosting) runs under QEMU mps2-an386
#    (Cortex-M4F) and mps2-an385 (Cortex-M3, soft float), -icount shift=0, float path (as the
#    Rust firmware's kda-f32) and integer-only path (as kda-fixed): its outputs must equal the
#    Rust API's for the Rust firmware's runs, bitwise, and, when .ci/embedded.sh has
#    run before (as in .ci/run), the Rust firmware's own log; instructions per decode token,
#    flash and RAM are tabled beside the Rust firmware's in target/capi/report.md.
# Installs what it needs (cbindgen into ~/.cache/kda-capi, Debian packages via apt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT="$ROOT/target/capi"
START=$(date +%s)

step() { printf '\n=== capi: %s\n' "$*"; }

step "toolchain"
rustup target add thumbv7em-none-eabihf thumbv7m-none-eabi
CBINDGEN_VERSION=0.29.4
CBINDGEN_ROOT="$HOME/.cache/kda-capi/cbindgen-$CBINDGEN_VERSION"
if [ ! -x "$CBINDGEN_ROOT/bin/cbindgen" ]; then
    cargo install cbindgen --version "$CBINDGEN_VERSION" --locked --root "$CBINDGEN_ROOT"
fi
export CBINDGEN="$CBINDGEN_ROOT/bin/cbindgen"
nano_libc() { command -v arm-none-eabi-gcc >/dev/null && [ -f "$(arm-none-eabi-gcc -print-file-name=libc_nano.a)" ]; }
if ! nano_libc || ! command -v qemu-system-arm >/dev/null || ! command -v cc >/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends \
        gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm gcc libc6-dev
fi
"$CBINDGEN" --version
arm-none-eabi-gcc --version | head -1
qemu-system-arm --version | head -1

step "kda.h is current (cbindgen)"
bash kda-capi/gen-header.sh --check

step "no_std build: clippy -D warnings for thumbv7em (panic-free lints), rlib tests on the host"
FW_FEATURES=(--no-default-features --features firmware-panic-handler)
# --no-deps: lint this crate only (kda-core is linted by .ci/run on the host).
cargo clippy -p kda-capi --no-deps --target thumbv7em-none-eabihf "${FW_FEATURES[@]}" -- -D warnings
cargo test -p kda-capi

step "static libraries: host (std; dev profile, which shares kda-core with the workspace tests) and Cortex-M (fat LTO, as the Rust firmware)"
cargo build -p kda-capi
FW_TARGET="$OUT/fw-target"
for t in thumbv7em-none-eabihf thumbv7m-none-eabi; do
    CARGO_PROFILE_RELEASE_LTO=fat CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 CARGO_PROFILE_RELEASE_OPT_LEVEL=3 \
        cargo build -p kda-capi --release --target "$t" "${FW_FEATURES[@]}" --target-dir "$FW_TARGET"
    ls -l "$FW_TARGET/$t/release/libkda_capi.a"
done

HOST_LIBS="target/debug/libkda_capi.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
CFLAGS_HOST="-std=c99 -O2 -Wall -Wextra -Werror -I kda-capi/include"
mkdir -p "$OUT"

step "host C example (cc) == Rust API, bitwise"
rm -rf "$OUT/data"
cargo run -q -p kda-capi --example export -- "$OUT/data" >/dev/null
# shellcheck disable=SC2086
cc $CFLAGS_HOST kda-capi/c/host_example.c $HOST_LIBS -o "$OUT/host_example"
for f in "$OUT"/data/*.kdal; do
    name=$(basename "$f" .kdal)
    "$OUT/host_example" "$f" >"$OUT/data/$name.c.out"
    if ! cmp -s "$OUT/data/$name.c.out" "$OUT/data/$name.expected"; then
        echo "FAIL $name: the C program's output differs from the Rust API's" >&2
        diff "$OUT/data/$name.c.out" "$OUT/data/$name.expected" | head -5 >&2
        exit 1
    fi
    printf '%-20s %3d output lines: bitwise equal\n' "$name" "$(wc -l <"$OUT/data/$name.c.out")"
done

step "C status tests (every status code from C)"
# shellcheck disable=SC2086
cc $CFLAGS_HOST kda-capi/c/status_test.c $HOST_LIBS -o "$OUT/status_test"
"$OUT/status_test" >"$OUT/status_test.log" || { cat "$OUT/status_test.log"; exit 1; }
tail -1 "$OUT/status_test.log"

step "C firmware (arm-none-eabi-gcc, newlib-nano) under QEMU: Cortex-M4F (an386), Cortex-M3 (an385)"
FW="$OUT/fw"
rm -rf "$FW"
cargo run -q -p kda-capi --example fw_export -- "$FW"

# fw_build_run BOARD VARIANT TARGET MACHINE QEMU_CPU GCC_FLAGS...: builds
# $FW/BOARD/kda-c-VARIANT (VARIANT f32: float path, `O` rows; fixed: integer path, `Q` rows),
# runs it, and checks its rows against the Rust API's (and the Rust firmware's log when present).
fw_build_run() {
    local board=$1 variant=$2 target=$3 machine=$4 cpu=$5
    shift 5
    local dir="$FW/$board" elf="$FW/$board/kda-c-$variant" rc=0 rows=O expected="$FW/fw_expected.txt"
    local define=()
    if [ "$variant" = fixed ]; then
        rows=Q
        expected="$FW/fw_expected_fixed.txt"
        define=(-DKDA_FW_FIXED)
    fi
    mkdir -p "$dir"
    arm-none-eabi-gcc "$@" "${define[@]}" -O2 -std=c99 -Wall -Wextra -Werror \
        -ffunction-sections -fdata-sections -I kda-capi/include -I kda-capi/firmware -I "$FW" \
        kda-capi/firmware/main.c kda-capi/firmware/startup.c \
        -T kda-capi/firmware/mps2.ld --specs=nano.specs --specs=nosys.specs -nostartfiles \
        -Wl,--gc-sections -Wl,-z,noexecstack \
        "$FW_TARGET/$target/release/libkda_capi.a" -lm -o "$elf"
    timeout 120 qemu-system-arm -machine "$machine" -cpu "$cpu" -nographic -monitor none -serial none \
        -semihosting-config enable=on,target=native -icount shift=0 -kernel "$elf" \
        >"$elf.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ] || ! grep -q '^DONE' "$elf.log"; then
        echo "FAIL: $board kda-c-$variant exited $rc" >&2
        grep -v "^$rows " "$elf.log" >&2
        exit 1
    fi
    grep -q '^CAL 200000 5000$' "$elf.log" ||
        { echo "FAIL: $board calibration is not 40 instructions a tick" >&2; exit 1; }
    grep "^$rows " "$elf.log" >"$elf.rows"
    cmp -s "$elf.rows" "$expected" ||
        { echo "FAIL: $board kda-c-$variant output != Rust API" >&2; exit 1; }
    echo "$board kda-c-$variant: $(wc -l <"$elf.rows") output rows bitwise equal to the Rust API's on the host"
    local rust="$ROOT/embedded/target/qemu/$board/kda-$variant.log"
    if [ -f "$rust" ]; then
        grep "^$rows " "$rust" | cmp -s "$elf.rows" - ||
            { echo "FAIL: $board kda-c-$variant output != the Rust firmware's ($rust)" >&2; exit 1; }
        echo "$board kda-c-$variant: bitwise equal to the Rust firmware's log ($rust)"
    else
        echo "note: $rust not found (run .ci/embedded.sh first, as .ci/run does): compared with the host only"
    fi
}
M4=(thumbv7em-none-eabihf mps2-an386 cortex-m4 -mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16)
M3=(thumbv7m-none-eabi mps2-an385 cortex-m3 -mcpu=cortex-m3 -mthumb -mfloat-abi=soft)
for v in f32 fixed; do
    fw_build_run m4 "$v" "${M4[@]}"
    fw_build_run m3 "$v" "${M3[@]}"
done

# One table row: label elf log. Instructions = timer ticks x 40 (the prompt: summed over its
# timed regions); flash = text + data, RAM = data + bss + stack high-water mark
# (arm-none-eabi-size, Berkeley format).
row() {
    local label=$1 elf=$2 log=$3
    read -r text data bss _ < <(arm-none-eabi-size -B "$elf" | tail -1)
    awk -v label="$label" -v text="$text" -v data="$data" -v bss="$bss" '
        $1 == "T" && $3 == "decode" { d[$2] += $5 * 40; nd[$2]++ }
        $1 == "T" && $3 == "prefill" { p[$2] += $5 * 40 }
        $1 == "STACK" { stack = $2 }
        END {
            printf "| %s | %.0fk / %.0fk | %.0fk / %.0fk | %d | %d (%d + %d) |\n", label,
                d["lb"] / nd["lb"] / 1000, d["sp"] / nd["sp"] / 1000, p["lb"] / 1000, p["sp"] / 1000,
                text + data, data + bss + stack, data + bss, stack
        }' "$log"
}
{
    echo "| board, path | instructions / decode token (lb / sp) | instructions / 8-token prompt | flash, bytes | RAM, bytes (static + stack) |"
    echo "|---|---|---|---|---|"
    for b in "m4:Cortex-M4F" "m3:Cortex-M3"; do
        for v in "f32:f32 weights, float path" "fixed:int8 weights, integer-only path"; do
            board=${b%%:*}
            variant=${v%%:*}
            label="${b#*:}, ${v#*:}"
            row "$label, C via kda.h" "$FW/$board/kda-c-$variant" "$FW/$board/kda-c-$variant.log"
            rust="$ROOT/embedded/target/qemu/$board/kda-$variant"
            if [ -f "$rust.log" ]; then row "$label, Rust (embedded/)" "$rust" "$rust.log"; fi
        done
    done
} >"$OUT/report.md"
cat "$OUT/report.md"

echo
echo "capi CI: all steps passed in $(( $(date +%s) - START )) s"
