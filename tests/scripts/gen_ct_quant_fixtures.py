#!/usr/bin/env python3
"""Make tests/fixtures/quant/ct_groups.safetensors: f32 rows and what compressed-tensors makes
of them as int4 / int8 `pack-quantized` groups, the reference kda-core's group quantiser
(`kda_core::quant::quantize_groups`) is tested against bit for bit
(kda-core/tests/quant_groups.rs).

For each scheme the scales and zero points come from compressed-tensors' `calculate_qparams`
over each group's min / max (what a static min-max observer gives), the scale is cast to the
scheme's scale dtype, and `PackedQuantizationCompressor.compress` quantises and packs, exactly
as tests/scripts/ct_tiny_kimi_linear.py makes the loader's fixtures.

Tensors: `input` F32 [rows, 256]; per scheme `<s>.packed`, `<s>.scale`, `<s>.zero_point`
(asymmetric schemes only) as U8 (the stored tensors' little-endian bytes: int32 words, scales
in the scale dtype). Metadata: `rows` (JSON names), `schemes` (JSON: name -> bits, group,
symmetric, scale dtype), versions.

Versions: tests/scripts/requirements-ct-quant.txt (torch 2.15.0, compressed-tensors 0.20.0,
numpy 2.4.6; the file is written by hand), Python 3.11.7, CPU. The output is the same for every run.

Usage: gen_ct_quant_fixtures.py [OUT]
"""
import json
import struct
import sys
from pathlib import Path

import compressed_tensors
import numpy as np
import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams

HERE = Path(__file__).resolve().parent
N = 256
SCHEMES = {  # name: (bits, group, symmetric, scale dtype)
    "int4_g32_sym_bf16": (4, 32, True, torch.bfloat16),
    "int4_g64_sym_f16": (4, 64, True, torch.float16),
    "int4_g128_asym_bf16": (4, 128, False, torch.bfloat16),
    "int4_g32_asym_f32": (4, 32, False, torch.float32),
    "int4_g256_asym_f16": (4, 256, False, torch.float16),
    "int8_g32_sym_f32": (8, 32, True, torch.float32),
    "int8_g64_sym_bf16": (8, 64, True, torch.bfloat16),
    "int8_g128_asym_bf16": (8, 128, False, torch.bfloat16),
}


def rows():
    g = torch.Generator().manual_seed(4646)
    out = []

    def add(name, v):
        out.append((name, torch.as_tensor(v, dtype=torch.float32).reshape(N)))

    for s in (0.02, 1.0):
        add(f"normal {s}", torch.randn(N, generator=g) * s)
        add(f"normal {s} bf16", (torch.randn(N, generator=g) * s).bfloat16().float())
    add("uniform", torch.rand(N, generator=g) * 2 - 1)
    add("zeros", torch.zeros(N))
    v = torch.randn(N, generator=g) * 0.02
    v[:128] = 0
    add("half zero", v)
    add("negative only", -(torch.randn(N, generator=g) * 0.05).abs())
    add("positive only", (torch.randn(N, generator=g) * 0.05).abs())
    add("positive, offset", 1 + (torch.randn(N, generator=g) * 0.05).abs())
    v = torch.randn(N, generator=g) * 0.02
    v[5] = 40.0
    add("one huge value", v)
    add("tiny 1e-30", torch.randn(N, generator=g) * 1e-30)
    add("f32 subnormal", torch.randn(N, generator=g) * 1e-42)
    add("constant", torch.full((N,), 0.3))
    # Ties: group max 7.5 gives int4 symmetric scale 1; steps of 1/2 then round half to even.
    t = (torch.arange(N) % 16).float() / 2 - 3.75
    t[::32] = 7.5
    add("ties int4", t)
    t = (torch.arange(N) % 64).float() - 31.5
    t[::32] = 127.5
    add("ties int8", t)
    add("dynamic range", (torch.randn(N, generator=g) * 10 ** (torch.rand(N, generator=g) * 8 - 6)).bfloat16().float())
    return out


def compress(x, bits, group, symmetric, scale_dtype):
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy="group", group_size=group)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    r, c = x.shape
    grp = x.reshape(r, c // group, group)
    scale, zp = calculate_qparams(grp.amin(-1), grp.amax(-1), args)
    sd = {"weight": x, "weight_scale": scale.to(scale_dtype)}
    if not symmetric:
        sd["weight_zero_point"] = zp.round().to(torch.int8)
    return PackedQuantizationCompressor.compress(sd, scheme)


def raw(t):
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return np.frombuffer(t.contiguous().numpy().tobytes(), dtype=np.uint8).copy()


def save(path, tensors, meta):
    """A safetensors file written by hand, header keys sorted, so runs are byte-identical."""
    dtypes = {np.float32: "F32", np.uint8: "U8"}
    header, blobs, at = {"__metadata__": meta}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        b = a.tobytes()
        header[name] = {"dtype": dtypes[a.dtype.type], "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else HERE.parent / "fixtures" / "quant" / "ct_groups.safetensors"
    named = rows()
    x = torch.stack([v for _, v in named])
    tensors = {"input": x.numpy()}
    for name, (bits, group, sym, sdt) in SCHEMES.items():
        c = compress(x, bits, group, sym, sdt)
        tensors[f"{name}.packed"] = raw(c["weight_packed"])
        tensors[f"{name}.scale"] = raw(c["weight_scale"])
        if not sym:
            tensors[f"{name}.zero_point"] = raw(c["weight_zero_point"])
    schemes = {n: [b, g, s, str(d).removeprefix("torch.")] for n, (b, g, s, d) in SCHEMES.items()}
    meta = {
        "rows": json.dumps([n for n, _ in named]),
        "schemes": json.dumps(schemes),
        "made_by": "tests/scripts/gen_ct_quant_fixtures.py",
        "compressed_tensors": compressed_tensors.__version__,
        "torch": torch.__version__,
    }
    save(out, tensors, meta)
    print(f"{out}: {len(named)} rows x {N}, {Path(out).stat().st_size} bytes")


if __name__ == "__main__":
    main()
