#!/usr/bin/env bash
# GPU verification of kda-cuda. Three ways to run it:
#
#   gpu-check.sh --build-only DIR
#       On a machine with cargo (no GPU needed): builds the release test executables — kda-cuda's
#       tests (tests/gpu.rs compares every kernel path with the CPU backend), the conformance
#       suite's `layer_fixtures` (every backend against the fla fixtures) and `device_vs_cpu`
#       (every fixture on the GPU against fla and the CPU backend) — and the bench example into
#       DIR, with the fixtures, this script and a runner `DIR/run`. Prints DIR's size; fails
#       above 64 MiB.
#
#   gpu-check.sh --prebuilt DIR --out LOGDIR [--python PYTHON_OR_VENV]
#   DIR/run --out LOGDIR [--python ...]
#       On the GPU machine, no cargo or Rust needed, only the NVIDIA driver and the CUDA 12 or 13
#       NVRTC and cuBLAS libraries (a CUDA toolkit, or the `nvidia-*` wheels of a Python
#       environment: PYTHON's `site` folders, default `python3`, are searched). Runs every step
#       under `timeout`, within KDA_GPU_CHECK_BUDGET seconds (default 450, under 8 minutes), and
#       writes two files into LOGDIR: results.md (the tables) and gpu-check.log (every step's
#       output). Exit status: 0 all passed on a device, 1 a step failed or timed out, 2 nothing
#       failed but there was no CUDA device (device steps print "skipped: no CUDA device").
#
#   gpu-check.sh [--out LOGDIR]
#       Both on one machine: --build-only into a temporary folder, then --prebuilt
#       (LOGDIR defaults to target/gpu-check).
#
# The executables find the CUDA libraries themselves (kda-cuda's src/libs.rs): KDA_CUDA_LIB_DIR,
# LD_LIBRARY_PATH, CUDA_HOME/CUDA_PATH, Python environments' nvidia/*/lib (KDA_CUDA_PYTHON_SITE,
# which this script fills from PYTHON), then the system folders (/usr/local/cuda/lib64,
# /usr/local/nvidia/lib64, ...).
set -uo pipefail

SCRIPT=$(readlink -f "$0")
usage() { sed -n '2,/^set -uo/p' "$SCRIPT" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "gpu-check: error: $*" >&2; exit 1; }

MAX_BYTES=$((64 * 1024 * 1024))

# ---------------------------------------------------------------------------------------------
# --build-only DIR

# Prints "name<TAB>path" for each release executable that cargo reports in JSON on stdin.
# Names: the target name; the library's unit tests are "kda_cuda-unit".
executables() {
    python3 -c '
import json, sys
want_tests = {"kda-cuda": None, "kda-conformance": {"layer_fixtures", "device_vs_cpu"}}
skip = {"emulated"}  # CPU-only: needs a C++ compiler and the .cu sources at run time
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    exe = m.get("executable")
    if m.get("reason") != "compiler-artifact" or not exe:
        continue
    manifest = m.get("manifest_path", "").replace("\\", "/")
    pkg_name = {"kda-cuda/Cargo.toml": "kda-cuda", "tests/Cargo.toml": "kda-conformance"}.get(
        "/".join(manifest.split("/")[-2:]))
    t = m["target"]
    name, kinds = t["name"], t["kind"]
    if "example" in kinds:
        if name in ("bench", "compile_check") and pkg_name == "kda-cuda":
            print(name + "\t" + exe)
        continue
    if pkg_name is None or name in skip:
        continue
    wanted = want_tests[pkg_name]
    if "lib" in kinds:
        if pkg_name == "kda-cuda":
            print("kda_cuda-unit\t" + exe)
    elif wanted is None or name in wanted:
        print(name + "\t" + exe)
'
}

build_only() {
    local dir=$1 root
    root=$(cd "$(dirname "$SCRIPT")/../.." && pwd)
    command -v cargo >/dev/null || die "--build-only needs cargo"
    command -v python3 >/dev/null || die "--build-only needs python3 (to read cargo's JSON)"
    if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ] && [ ! -e "$dir/manifest.txt" ]; then
        die "$dir exists and is not a gpu-check build folder (no manifest.txt): not touching it"
    fi
    rm -rf "$dir" && mkdir -p "$dir/bin" "$dir/fixtures" || die "cannot create $dir"
    cd "$root" || die "cannot enter $root"
    # Release, without debug info (the workspace's release profile has `debug = 1`).
    export CARGO_PROFILE_RELEASE_DEBUG=0 CARGO_PROFILE_RELEASE_STRIP=debuginfo
    local list
    list=$(mktemp)
    echo "building release test executables and the bench example ..."
    { cargo test --release -p kda-cuda --no-run --message-format=json &&
      cargo test --release -p kda-conformance --test layer_fixtures --test device_vs_cpu --no-run \
          --message-format=json &&
      cargo build --release -p kda-cuda --example bench --example compile_check \
          --message-format=json; } \
        | executables > "$list" || { rm -f "$list"; die "build failed"; }
    local n name path
    while IFS=$'\t' read -r name path; do
        cp "$path" "$dir/bin/$name" || die "copy $path"
    done < "$list"
    rm -f "$list"
    n=$(ls "$dir/bin" | wc -l)
    for name in kda_cuda-unit gpu probe no_device layer_fixtures device_vs_cpu bench compile_check; do
        [ -x "$dir/bin/$name" ] || die "executable '$name' missing from the build"
    done
    cp tests/fixtures/*.safetensors "$dir/fixtures/" || die "copy fixtures"
    cp "$SCRIPT" "$dir/gpu-check.sh"
    cat > "$dir/run" <<'RUN'
#!/usr/bin/env bash
# Runs the prebuilt GPU check in this folder: run --out LOGDIR [--python PYTHON_OR_VENV]
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/gpu-check.sh" --prebuilt "$here" "$@"
RUN
    chmod +x "$dir/run" "$dir/gpu-check.sh"
    {
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version 2>/dev/null | head -1)"
        echo "commit: $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
        echo "rustc: $(rustc --version)"
        echo "executables: $n"
        (cd "$dir" && find bin fixtures -type f -printf '%10s  %p\n' | sort -k2)
    } > "$dir/manifest.txt"
    local bytes tree
    bytes=$(du -sb "$dir" | cut -f1)
    tree=$(git ls-files -z 2>/dev/null | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
    echo "gpu-check build: $n executables in $dir, $(mib "$bytes") MiB (limit 64 MiB)"
    if [ -n "$tree" ]; then
        echo "  with the tracked working tree ($(mib "$tree") MiB): $(mib $((tree + bytes))) MiB travel to a device machine (limit 64 MiB)"
    fi
    [ "$bytes" -le "$MAX_BYTES" ] || die "$dir is larger than 64 MiB"
}

# ---------------------------------------------------------------------------------------------
# --prebuilt DIR --out LOGDIR

# Colon-separated site-packages folders of a Python executable or a virtual-environment folder.
python_sites() {
    local py=$1
    if [ -d "$py" ]; then
        if [ -x "$py/bin/python3" ]; then
            py="$py/bin/python3"
        else
            ls -d "$py"/lib/python3*/site-packages 2>/dev/null | paste -sd: -
            return
        fi
    fi
    command -v "$py" >/dev/null || return 0
    timeout 30 "$py" -c 'import site, sys
dirs = list(site.getsitepackages()) + [site.getusersitepackages()] + [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
print(":".join(dict.fromkeys(dirs)))' 2>/dev/null
}

prebuilt() {
    local dir=$1 out=$2 python=$3 budget=${KDA_GPU_CHECK_BUDGET:-450}
    dir=$(cd "$dir" 2>/dev/null && pwd) || die "no such folder: $1"
    [ -x "$dir/bin/gpu" ] || die "$dir holds no prebuilt executables (run --build-only first)"
    [ "$budget" -le 480 ] || die "KDA_GPU_CHECK_BUDGET=$budget: the check must stay under 8 minutes"
    mkdir -p "$out" || die "cannot create $out"
    out=$(cd "$out" && pwd)
    local start=$SECONDS work
    work=$(mktemp -d) || die "mktemp"
    local log="$out/gpu-check.log" results="$out/results.md" steps="$work/steps.md"
    : > "$log"
    : > "$steps"

    local sites
    sites=$(python_sites "${python:-python3}")
    export KDA_CUDA_PYTHON_SITE="${KDA_CUDA_PYTHON_SITE:+$KDA_CUDA_PYTHON_SITE:}$sites"
    export KDA_FIXTURES_DIR="$dir/fixtures" KDA_CUDA_SKIP_EMULATOR=1 RUST_BACKTRACE=1
    {
        echo "=== environment"
        echo "host: $(uname -srm), $(nproc) CPUs; cargo on PATH: $(command -v cargo || echo no)"
        echo "python: ${python:-python3}; KDA_CUDA_PYTHON_SITE=$KDA_CUDA_PYTHON_SITE"
        echo "KDA_CUDA_LIB_DIR=${KDA_CUDA_LIB_DIR:-}  LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}  CUDA_HOME=${CUDA_HOME:-}"
        sed 's/^/build /' "$dir/manifest.txt" | head -4
    } >> "$log"

    local device
    device=$(timeout 20 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total \
        --format=csv,noheader 2>&1) || device="nvidia-smi unavailable: ${device:-not found}"
    echo "device: $device" >> "$log"

    local failed=0 nodevice=0
    # step NAME CAP_SECONDS COMMAND... : runs under timeout, logs, adds a row to the steps table.
    step() {
        local name=$1 cap=$2
        shift 2
        local left=$((budget - (SECONDS - start) - 5)) t status note rc t0
        t=$((cap < left ? cap : left))
        if [ "$t" -lt 10 ]; then
            echo "| $name | not run: time budget spent | 0 | |" >> "$steps"
            failed=1
            return
        fi
        printf '\n=== %s (limit %ss; %ss of %ss used)\n' "$name" "$t" $((SECONDS - start)) "$budget" >> "$log"
        t0=$SECONDS
        timeout -k 5 "$t" "$@" > "$work/step.log" 2>&1
        rc=$?
        cat "$work/step.log" >> "$log"
        note=$(grep -m1 -E '^test result:' "$work/step.log" | sed 's/; finished in.*//')
        [ -n "$note" ] || note=$(tail -n1 "$work/step.log" | cut -c1-160)
        if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
            status="TIMEOUT after ${t}s"; failed=1
        elif [ $rc -ne 0 ]; then
            status="FAILED (exit $rc)"; failed=1
            note=$(grep -m1 -E 'panicked|error|FAILED' "$work/step.log" | cut -c1-160)
        elif grep -q 'skipped: no CUDA device' "$work/step.log"; then
            status="no CUDA device"; nodevice=1
            note=$(grep -m1 -o 'skipped: no CUDA device.*' "$work/step.log" | cut -c1-160)
        else
            status="passed"
        fi
        echo "| $name | $status | $((SECONDS - t0)) | ${note//|/\\|} |" >> "$steps"
        cp "$work/step.log" "$work/$name.log"
    }

    local b="$dir/bin" arch
    # NVRTC alone (no device needed): every kernel for this GPU's architecture (sm_90 when unknown).
    arch=$(echo "$device" | awk -F', ' 'NR == 1 && $2 ~ /^[0-9]+\.[0-9]+$/ { sub(/\./, "", $2); print "sm_" $2 }')
    step nvrtc 90 "$b/compile_check" "${arch:-sm_90}"
    step kda_cuda-unit 60 "$b/kda_cuda-unit" --test-threads=2
    local t
    for t in probe no_device validation kernels_embedded panic_hook; do
        [ -x "$b/$t" ] && step "$t" 60 "$b/$t"
    done
    step gpu 150 "$b/gpu" --nocapture --test-threads=1
    step layer_fixtures 90 "$b/layer_fixtures" --nocapture --test-threads=1 every_layer_fixture
    step device_vs_cpu 90 "$b/device_vs_cpu" --nocapture --test-threads=1
    local quick=()
    [ $((budget - (SECONDS - start))) -lt 150 ] && quick=(--quick)
    step bench 200 "$b/bench" "${quick[@]}"

    local verdict=OK code=0
    if [ $failed -ne 0 ]; then
        verdict=FAILED; code=1
    elif [ $nodevice -ne 0 ]; then
        verdict="NO CUDA DEVICE (nothing measured)"; code=2
    fi
    {
        echo "# kda-cuda GPU check: $verdict"
        echo
        echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ), $((SECONDS - start)) s of a ${budget} s budget"
        echo "- device: $device"
        sed 's/^/- build /' "$dir/manifest.txt" | head -3
        grep -h -m1 '^NVRTC ' "$work/nvrtc.log" 2>/dev/null | sed 's/^/- compiler: /'
        grep -h -m3 '^library: ' "$work/bench.log" 2>/dev/null | sed 's/^/- /'
        echo
        echo "## Steps"
        echo
        echo "| step | result | seconds | note |"
        echo "|---|---|---:|---|"
        cat "$steps"
        echo
        echo "## Every fla fixture on the GPU: rel-RMS against fla and against the CPU backend"
        echo
        if grep -q '^| layer_' "$work/device_vs_cpu.log" 2>/dev/null; then
            grep -E '^\|(---| fixture | layer_)' "$work/device_vs_cpu.log"
            echo
            grep -h -E '^GPU fixtures:|panicked' -A1 "$work/device_vs_cpu.log"
        else
            echo "not measured ($(grep -m1 -o 'skipped: no CUDA device' "$work/device_vs_cpu.log" 2>/dev/null || echo 'see gpu-check.log'))"
        fi
        echo
        echo "## Conformance table, every backend against fla (layer_fixtures)"
        echo
        echo '```'
        grep -E '^cuda|worst|skipped|panicked|rel-RMS' "$work/layer_fixtures.log" 2>/dev/null | head -40
        echo '```'
        echo
        echo "## GPU against CPU on random layers (kda-cuda tests/gpu.rs)"
        echo
        echo '```'
        grep -E 'rel-RMS|out [0-9]|cuda:|skipped|unsupported|panicked' "$work/gpu.log" 2>/dev/null | head -60
        echo '```'
        echo
        echo "## Speed (bench)"
        echo
        if grep -q '^| case' "$work/bench.log" 2>/dev/null; then
            sed -n '/^| case/,$p' "$work/bench.log"
        else
            grep -E '^measured: |skipped|FAILED' "$work/bench.log" 2>/dev/null || echo "not measured"
        fi
    } > "$results"
    rm -rf "$work"
    printf '\ngpu-check: %s in %ds; %s\n' "$verdict" $((SECONDS - start)) "$results"
    exit $code
}

# ---------------------------------------------------------------------------------------------

mode=full dir="" out="" python=""
while [ $# -gt 0 ]; do
    case $1 in
        --build-only) mode=build dir=${2:-}; shift 2 || die "--build-only needs DIR" ;;
        --prebuilt) mode=prebuilt dir=${2:-}; shift 2 || die "--prebuilt needs DIR" ;;
        --out) out=${2:-}; shift 2 || die "--out needs LOGDIR" ;;
        --python) python=${2:-}; shift 2 || die "--python needs a python executable or a venv folder" ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done
[ "$mode" = full ] || [ -n "$dir" ] || die "missing DIR"

case $mode in
    build) build_only "$dir" ;;
    prebuilt)
        [ -n "$out" ] || die "--prebuilt needs --out LOGDIR"
        prebuilt "$dir" "$out" "$python" ;;
    full)
        root=$(cd "$(dirname "$SCRIPT")/../.." && pwd)
        tmp=$(mktemp -d) || die "mktemp"
        trap 'rm -rf "$tmp"' EXIT
        (build_only "$tmp/prebuilt") || exit 1
        prebuilt "$tmp/prebuilt" "${out:-$root/target/gpu-check}" "$python" ;;
esac
