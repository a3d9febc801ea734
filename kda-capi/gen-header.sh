#!/usr/bin/env bash
# Regenerates kda-capi/include/kda.h with cbindgen (installed by .ci/capi.sh), or with --check
# fails if the committed header differs from a fresh one.
set -euo pipefail
cd "$(dirname "$0")"
CBINDGEN=${CBINDGEN:-cbindgen}
if [ "${1:-}" = "--check" ]; then
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    "$CBINDGEN" --config cbindgen.toml --crate kda-capi --output "$tmp" --quiet
    if ! diff -u include/kda.h "$tmp"; then
        echo "kda-capi/include/kda.h is out of date: run bash kda-capi/gen-header.sh" >&2
        exit 1
    fi
    echo "kda.h is current"
else
    "$CBINDGEN" --config cbindgen.toml --crate kda-capi --output include/kda.h --quiet
fi
