#!/usr/bin/env python3
"""Check a `kda quantize` GGUF against its HF checkpoint with gguf-py alone (no kda code):
gguf-py's GGUFReader must read the file; every KDA tensor must have llama.cpp's name and the
converter's shape; dequantised by gguf-py (`gguf.quants.dequantize`) it must be close to the
checkpoint's values (the converter's transforms applied: ssm_a = -exp(A_log), conv reshape);
and where gguf-py quantises the type itself (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) its bytes must be
gguf-py's. With `--reference REF.gguf` (a file llama.cpp's converter or llama-quantize made
from the same checkpoint), every tensor must also have REF's type, shape and bytes, and every
key both files have the same value. Prints one line per tensor; exits 1 on any mismatch.

Versions: tests/scripts/requirements-quant.txt (numpy 2.2.6, gguf 0.19.0). The checkpoint's
safetensors are read by hand (numpy only; F32 / BF16 / F16).

Usage: check_quantized_gguf.py HF_DIR FILE.gguf [--reference REF.gguf]
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

HF = {  # GGUF suffix -> HF suffix (model.layers.{i}.self_attn.)
    "attn_q.weight": "q_proj.weight", "attn_k.weight": "k_proj.weight",
    "attn_v.weight": "v_proj.weight", "ssm_conv1d_q.weight": "q_conv1d.weight",
    "ssm_conv1d_k.weight": "k_conv1d.weight", "ssm_conv1d_v.weight": "v_conv1d.weight",
    "ssm_a": "A_log", "ssm_dt.bias": "dt_bias", "ssm_f_a.weight": "f_a_proj.weight",
    "ssm_f_b.weight": "f_b_proj.weight", "ssm_beta.weight": "b_proj.weight",
    "ssm_g_a.weight": "g_a_proj.weight", "ssm_g_b.weight": "g_b_proj.weight",
    "ssm_norm.weight": "o_norm.weight", "attn_output.weight": "o_proj.weight",
}
GGUF_PY_QUANTISES = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}
# rel-RMS bound of the dequantised weights per type (about 3x the typical error)
BOUND = {T.Q8_0: 0.02, T.Q6_K: 0.06, T.Q5_0: 0.15, T.Q5_1: 0.15, T.Q4_K: 0.25,
         T.Q5_K: 0.12, T.Q4_0: 0.3, T.Q4_1: 0.3, T.F16: 1e-3, T.F32: 1e-6}


def read_safetensors(dirpath):
    files = sorted(Path(dirpath).glob("*.safetensors"))
    out = {}
    for f in files:
        b = f.read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        base = 8 + n
        for k, v in h.items():
            if k == "__metadata__":
                continue
            s, e = v["data_offsets"]
            raw = b[base + s:base + e]
            if v["dtype"] == "BF16":
                a = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
            else:
                a = np.frombuffer(raw, {"F32": np.float32, "F16": np.float16}[v["dtype"]]).astype(np.float32)
            out[k] = a.reshape(v["shape"])
    return out


def squeezed(shape):
    """`ne` without trailing 1s: ggml's own writer (llama-quantize) drops them (`ggml_n_dims`),
    gguf-py's (the converter, kda) keeps the shape given; llama.cpp reads both."""
    ne = [int(v) for v in shape]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return ne


def compare(r, ref, verbose=True):
    """Tensors (type, shape, bytes) and shared keys of `r` against `ref`; prints each tensor
    (only the differing ones unless `verbose`)."""
    bad = 0
    theirs = {t.name: t for t in ref.tensors}
    for t in r.tensors:
        u = theirs.get(t.name)
        same = u is not None and u.tensor_type == t.tensor_type and squeezed(u.shape) == squeezed(t.shape) \
            and np.array_equal(np.asarray(t.data).view(np.uint8).reshape(-1),
                               np.asarray(u.data).view(np.uint8).reshape(-1))
        if verbose or not same:
            what = "same type, shape and bytes as the reference" if same else "DIFFERS from the reference"
            extra = "" if same or u is None else f" ({t.tensor_type.name} vs {u.tensor_type.name})"
            print(f"{t.name:<28} {what}{extra}")
        bad += not same
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k not in ref.fields or k == "general.name":
            continue
        a, b = f.contents(), ref.fields[k].contents()
        if a != b:
            print(f"key {k}: {a!r}, reference {b!r}")
            bad += 1
    only = [k for k in r.fields if k not in ref.fields and not k.startswith("GGUF.")]
    print(f"keys the reference lacks: {only}")
    missing = [k for k in ref.fields if k not in r.fields and not k.startswith("GGUF.")]
    print(f"keys only the reference has: {missing}")
    return bad


def main():
    hf = read_safetensors(sys.argv[1])
    r = GGUFReader(sys.argv[2])
    assert r.fields["general.architecture"].contents() == "kimi-linear"
    bad = 0
    for t in r.tensors:
        _, layer, suffix = t.name.split(".", 2)
        x = hf[f"model.layers.{layer}.self_attn.{HF[suffix]}"].astype(np.float32)
        if suffix == "ssm_a":
            x = -np.exp(x.astype(np.float64)).astype(np.float32)
        ne = [int(v) for v in t.shape]
        want = x.reshape(-1)
        got = dequantize(t.data, t.tensor_type).reshape(-1).astype(np.float64)
        if len(got) != len(want):
            print(f"{t.name}: {len(got)} values, checkpoint {len(want)}")
            bad += 1
            continue
        rel = np.sqrt(np.sum((got - want) ** 2) / max(np.sum(want.astype(np.float64) ** 2), 1e-300))
        same = ""
        if t.tensor_type in GGUF_PY_QUANTISES:
            py = quantize(x.reshape(-1, ne[0]), t.tensor_type)
            ok = np.array_equal(py.reshape(-1), np.asarray(t.data).reshape(-1))
            same = ", bytes = gguf-py's" if ok else ", BYTES DIFFER from gguf-py's"
            bad += not ok
        ok = rel <= BOUND[t.tensor_type]
        bad += not ok
        print(f"{t.name:<28} {t.tensor_type.name:<5} ne {ne}: rel-RMS {rel:.2e}{same}{'' if ok else ' TOO LARGE'}")
    if len(sys.argv) > 4 and sys.argv[3] == "--reference":
        bad += compare(r, GGUFReader(sys.argv[4]))
    print("OK" if bad == 0 else f"{bad} problems")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
