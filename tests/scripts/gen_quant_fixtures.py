#!/usr/bin/env python3
"""Make tests/fixtures/quant/ggml_blocks.safetensors: f32 rows and what ggml's reference
quantisers make of them, the reference kda-core's encoders (kda-core/src/quant/encode.rs) are
tested against bit for bit (kda-core/tests/quant_encode.rs).

For every format the bytes come from ggml's own `quantize_row_*_ref` (ggml-quants.c of the
llama-cpp-python 0.3.36 sdist, vendor/llama.cpp/ggml), compiled here with gcc into
tests/scripts/quant_ref.c; that is what llama-quantize writes without an importance matrix. For
Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 the script also quantises with gguf-py (`gguf.quants.quantize`,
gguf 0.19.0, pure numpy) and stops unless both give the same bytes. Each format's
`<fmt>.err` is the RMS error of the stored row, dequantised by gguf-py (`gguf.quants.dequantize`),
against the input, in float64.

Versions: Python 3.11.7, numpy 2.2.6, gguf 0.19.0 (tests/scripts/requirements-quant.txt), gcc
12 (Debian 12), x86-64. The output is the same for every run (seed 46).

Usage:
  pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36   # then untar it
  gen_quant_fixtures.py SDIST_DIR [OUT]   # OUT: tests/fixtures/quant/ggml_blocks.safetensors
"""
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

HERE = Path(__file__).resolve().parent
FORMATS = {
    "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q8_0": T.Q8_0,
    "q2_k": T.Q2_K, "q3_k": T.Q3_K, "q4_k": T.Q4_K, "q5_k": T.Q5_K, "q6_k": T.Q6_K,
}
GGUF_PY_QUANTISES = {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"}
# Where gguf-py and ggml write different bytes (the fixture holds ggml's): a block of -0.0.
# ggml's running maximum starts at +0.0 and stays there, so d = 0 / -8 = -0.0; gguf-py takes
# the block's own -0.0 and gets +0.0. Only the sign of d differs.
KNOWN_DIFFERENCES = {("q4_0", "negative zeros"), ("q5_0", "negative zeros")}
N = 256


def bf16(x):
    """Round float32 to bfloat16 (nearest even) and back, as checkpoints store weights."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return (b << 16).astype(np.uint32).view(np.float32)


def rows():
    """The input rows: typical weights, then edge cases. Each is 256 float32 values."""
    rng = np.random.default_rng(46)
    out = []

    def add(name, v):
        v = np.asarray(v, dtype=np.float32).reshape(N)
        out.append((name, v))

    for s in (0.02, 0.05, 1.0):
        add(f"normal {s}", rng.normal(0, s, N))
        add(f"normal {s} bf16", bf16(rng.normal(0, s, N)))
    add("uniform", rng.uniform(-1, 1, N))
    add("student-t 3", bf16(0.02 * rng.standard_t(3, N)))
    add("zeros", np.zeros(N))
    add("negative zeros", -np.zeros(N))
    v = rng.normal(0, 0.02, N)
    v[37] = 1e4
    add("one huge value", v)
    v = rng.normal(0, 0.02, N)
    v[200] = -300.0
    add("one huge negative value", v)
    add("negative only", -np.abs(rng.normal(0, 0.05, N)))
    add("positive only", np.abs(rng.normal(0, 0.05, N)))
    add("positive only, offset", 1.0 + np.abs(rng.normal(0, 0.05, N)))
    add("tiny 1e-6", rng.normal(0, 1e-6, N))
    add("tiny 1e-12", rng.normal(0, 1e-12, N))
    add("tiny 1e-20", rng.normal(0, 1e-20, N))
    add("f32 subnormal", rng.normal(0, 1e-42, N))
    add("large 3e3", rng.normal(0, 3e3, N))
    add("near f16 max", rng.uniform(-6e4, 6e4, N))
    add("constant", np.full(N, 0.5))
    add("constant negative", np.full(N, -0.25))
    v = np.zeros(N)
    v[rng.choice(N, 12, replace=False)] = rng.normal(0, 0.1, 12)
    add("sparse", v)
    v = np.zeros(N)
    v[::32] = rng.normal(0, 1, N // 32)
    add("one per block", v)
    add("sub-blocks 1e-4 .. 1e3", rng.normal(0, 1, N) * np.repeat(10.0 ** np.arange(-4, 4), 32))
    add("16-blocks 1e-3 .. 1e4", rng.normal(0, 1, N) * np.repeat(10.0 ** np.linspace(-3, 4, 16), 16))
    # Ties: steps of 1/2 where the scale is 1 (Q8_0: max 127; Q4_0: max -8; Q5_0: max -16).
    add("ties q8_0", np.where(np.arange(N) % 32 == 0, 127.0, np.arange(N) % 64 - 31.5))
    add("ties q4_0", np.where(np.arange(N) % 32 == 0, -8.0, (np.arange(N) % 16) / 2 - 4.0))
    add("ties q5_0", np.where(np.arange(N) % 32 == 0, -16.0, (np.arange(N) % 32) / 2 - 8.0))
    add("integers 0..15", np.arange(N) % 16)
    add("integers -32..31", np.arange(N) % 64 - 32)
    add("ramp", np.linspace(-1, 1, N))
    add("bimodal", np.where(rng.uniform(size=N) < 0.5, -1.0, 1.0) + rng.normal(0, 0.01, N))
    add("dynamic range", bf16(rng.normal(0, 1, N) * 10.0 ** rng.uniform(-8, 2, N)))
    return out


def build_ref(sdist, tmp):
    g = Path(sdist) / "vendor" / "llama.cpp" / "ggml"
    exe = Path(tmp) / "quant_ref"
    cmd = ["gcc", "-O2", "-DNDEBUG", "-std=gnu11", f"-I{g}/include", f"-I{g}/src",
           f"-I{g}/src/ggml-cpu", str(HERE / "quant_ref.c"), str(g / "src" / "ggml-quants.c"),
           "-lm", "-o", str(exe)]
    subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
    return exe


def save(path, tensors, meta):
    """A safetensors file, written by hand (numpy only), keys sorted."""
    dtypes = {np.float32: "F32", np.float64: "F64", np.uint8: "U8"}
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.tobytes()
        header[name] = {"dtype": dtypes[a.dtype.type], "shape": list(a.shape),
                        "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    sdist = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else HERE.parent / "fixtures" / "quant" / "ggml_blocks.safetensors"
    named = rows()
    x = np.stack([v for _, v in named]).astype(np.float32)
    tensors = {"input": x}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_ref(sdist, tmp)
        for fmt, qt in FORMATS.items():
            q = subprocess.run([str(exe), fmt], input=x.tobytes(), capture_output=True, check=True).stdout
            q = np.frombuffer(q, dtype=np.uint8).reshape(len(named), -1)
            if fmt in GGUF_PY_QUANTISES:
                with np.errstate(all="ignore"):
                    py = quantize(x, qt)
                bad = {(fmt, named[r][0]) for r in range(len(named)) if not np.array_equal(py[r], q[r])}
                if bad - KNOWN_DIFFERENCES:
                    sys.exit(f"gguf-py and ggml differ on {sorted(bad - KNOWN_DIFFERENCES)}")
            with np.errstate(all="ignore"):
                d = dequantize(q, qt).astype(np.float64)
            err = np.sqrt(np.mean((d - x.astype(np.float64)) ** 2, axis=1))
            tensors[fmt] = q
            tensors[f"{fmt}.err"] = err
    meta = {
        "rows": json.dumps([n for n, _ in named]),
        "made_by": "tests/scripts/gen_quant_fixtures.py",
        "ggml": "llama-cpp-python 0.3.36 sdist, vendor/llama.cpp/ggml/src/ggml-quants.c, gcc -O2 x86-64",
        "gguf_py": "0.19.0",
        "numpy": np.__version__,
    }
    save(out, tensors, meta)
    print(f"{out}: {len(named)} rows x {N}, {Path(out).stat().st_size} bytes")


if __name__ == "__main__":
    main()
