#!/usr/bin/env bash
# Checks that kda-cuda, built against cudarc's CUDA 13.0 bindings (`cuda-13000`), uses no driver,
# NVRTC or cuBLAS entry point that CUDA 12 lacks, so the same binary runs on CUDA 12 drivers and
# libraries.
#
# cudarc resolves each C function on its first call and caches it in a `static _S` inside the
# Rust wrapper, so the debug symbols of an executable name exactly the entry points it can
# reach (`cudarc::driver::sys::cuLaunchKernel::_S`). This script builds kda-cuda's tests and
# examples (debug), lists those symbols with `nm`, and looks each one up in cudarc's own
# bindings, whose `#[cfg(any(feature = "cuda-12000", ...))]` says in which CUDA versions it
# exists. It fails when an entry point is missing from the CUDA 12.0 bindings, or when no
# entry point was found at all (the check would then prove nothing).
#
# Usage: kda-cuda/scripts/cuda12-symbols.sh      (needs cargo, python3 and nm)
# KDA_CUDA_SYMBOL_BASELINE=cuda-12080 checks against another binding set.
set -euo pipefail
cd "$(dirname "$0")/../.."

# cargo's own messages go to a file, shown when the build fails (a full disk, say).
build_log=$(mktemp)
trap 'rm -f "$build_log"' EXIT
exes=$(cargo test -p kda-cuda --no-run --message-format=json 2>"$build_log" |
    python3 -c 'import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])') || {
    echo "error: cargo test -p kda-cuda --no-run failed:" >&2
    tail -40 "$build_log" >&2
    exit 1
}
[ -n "$exes" ] || { echo "error: cargo built no executable" >&2; exit 1; }
cudarc=$(cargo metadata --format-version 1 2>/dev/null | python3 -c 'import json, os, sys
m = json.load(sys.stdin)
print(next(os.path.dirname(p["manifest_path"]) for p in m["packages"] if p["name"] == "cudarc"))')

# shellcheck disable=SC2086
for e in $exes; do nm -C "$e"; done |
    grep -oE 'cudarc::(driver|nvrtc|cublas)::sys::[A-Za-z0-9_]+::_S' | sort -u |
    python3 -c '
import re, sys
src, baseline = sys.argv[1] + "/src", sys.argv[2]
used = {}
for line in sys.stdin:
    _, module, _, name, _ = line.strip().split("::")
    used.setdefault(module, set()).add(name)
if sum(len(v) for v in used.values()) == 0:
    sys.exit("error: no cudarc entry point found in the executables (were they stripped?)")
bad = []
for module, names in sorted(used.items()):
    text = open(f"{src}/{module}/sys/mod.rs").read()
    gates = {}
    for m in re.finditer(r"(#\[cfg\(any\(([^\]]*)\)\)\]\n)?pub unsafe fn (\w+)", text):
        gates[m.group(3)] = m.group(2)
    miss = []
    for n in sorted(names):
        gate = gates.get(n, "missing")
        if gate is not None and f"\"{baseline}\"" not in gate:
            miss.append(f"{module}: {n} ({gate[:60]})")
    print(f"{module}: {len(names)} entry points, {len(names) - len(miss)} in the {baseline} bindings")
    bad.extend(miss)
if bad:
    sys.exit(f"entry points missing from the {baseline} bindings:\n  " + "\n  ".join(bad))
' "$cudarc" "${KDA_CUDA_SYMBOL_BASELINE:-cuda-12000}"
