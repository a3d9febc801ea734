#!/usr/bin/env bash
# The published crates as crates.io would receive them (kda-py and kda-conformance are
# `publish = false`).
#
# 1. `cargo package` of kda-core, kda-host, kda-cuda and kda-capi in one call, with
#    verification: cargo unpacks each .crate and builds it (library and binaries), resolving
#    kda-core for the other three from the kda-core .crate it has just made (kda-core is not on
#    crates.io, so packaging them one at a time cannot verify them). The working tree is packaged
#    as it is (`--allow-dirty`), so the check also runs before a commit.
# 2. Any warning fails, but the one expected: kda-capi's `fw_export` example compiles in the
#    embedded workspace's weights (`embedded/model/src/weights.rs`), so the package leaves it
#    out and cargo drops its `[[example]]` section.
# 3. Each file list: README.md and both licence files; every file that a packaged source names
#    in `include_str!`, `include_bytes!` or `#[path = "..."]` (the CUDA kernels, the benches'
#    shared module; verification builds the library only, so the tests', examples' and benches'
#    references are checked here); kda-capi's `include/kda.h`; nothing from the fixtures, the
#    device results or the scripts, and no file over 256 KiB.
# Needs the crates.io index (the verification builds resolve their dependencies there).
set -euo pipefail
cd "$(dirname "$0")/.."

CRATES=(kda-core kda-host kda-cuda kda-capi)
EXPECTED_WARNING='ignoring example `fw_export` as `examples/fw_export.rs` is not included in the published package'
MAX_FILE_BYTES=$((256 * 1024))

log=$(mktemp)
trap 'rm -f "$log"' EXIT
args=()
for c in "${CRATES[@]}"; do args+=(-p "$c"); done

# Cargo unpacks each .crate it verifies against into $CARGO_HOME/registry/src/<registry>/ and
# reuses a folder already there without unpacking again. The registry is the local one under
# target/package/, so a CARGO_HOME kept from a run at the same path (a cached CI home) holds
# the previous run's kda-core 0.1.0, and kda-capi would be verified against that old source.
# None of these crates is on crates.io, so their unpacked folders and cached .crate files are
# all ours to clear.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for c in "${CRATES[@]}"; do
    rm -rf "$cargo_home"/registry/src/*/"$c"-[0-9]* "$cargo_home"/registry/cache/*/"$c"-[0-9]*.crate
done
# The same for a target/ kept between runs: its package/ folder holds the last run's .crate
# files and their local registry.
rm -rf target/package

start=$(date +%s)
cargo package "${args[@]}" --allow-dirty --color never 2>&1 | tee "$log"
echo "cargo package with verification: $(($(date +%s) - start)) s"

unexpected=$(grep '^warning' "$log" | grep -vxF "warning: $EXPECTED_WARNING" || true)
if [ -n "$unexpected" ]; then
    echo "error: cargo package warned:" >&2
    echo "$unexpected" >&2
    exit 1
fi
if grep -qxF "warning: $EXPECTED_WARNING" "$log"; then
    echo "(the fw_export warning is expected: that example needs the embedded workspace)"
fi

fail=0
problem() {
    echo "error: $1" >&2
    fail=1
}

# The paths a packaged file refers to (include_str!/include_bytes!/#[path]), relative to the
# crate root: `dir/of/file/<literal>` with `a/../` steps folded.
referenced() {
    local crate=$1 file=$2 dir
    dir=$(dirname "$file")
    grep -oE '(include_str!|include_bytes!)\("[^"]+"\)|#\[path = "[^"]+"\]' "$crate/$file" |
        sed -E 's/.*"([^"]+)".*/\1/' |
        while read -r rel; do
            realpath -m --relative-to="$crate" "$crate/$dir/$rel"
        done
}

for c in "${CRATES[@]}"; do
    files=$(cargo package --list -p "$c" --allow-dirty 2>/dev/null)
    has() { grep -qxF "$1" <<<"$files"; }
    for f in README.md LICENSE-MIT LICENSE-APACHE; do
        has "$f" || problem "$c: the package lacks $f"
    done
    if [ "$c" = kda-capi ]; then
        has include/kda.h || problem "kda-capi: the package lacks include/kda.h"
    fi
    while read -r f; do
        case "$f" in
            *.rs) ;;
            *) continue ;;
        esac
        while read -r ref; do
            [ -z "$ref" ] && continue
            if ! has "$ref"; then
                problem "$c: $f refers to $ref, which the package lacks"
            fi
        done < <(referenced "$c" "$f")
    done <<<"$files"
    while read -r f; do
        case "$f" in
            fixtures/* | */fixtures/* | results/* | */results/* | scripts/* | */scripts/*)
                problem "$c: the package holds $f (fixtures, results and scripts stay out)"
                ;;
        esac
        if [ -f "$c/$f" ] && [ "$(stat -L -c %s "$c/$f")" -gt "$MAX_FILE_BYTES" ]; then
            problem "$c: $f is over $MAX_FILE_BYTES bytes"
        fi
    done <<<"$files"
    echo "$c: $(wc -l <<<"$files") files listed, checked"
done
exit "$fail"
