#!/usr/bin/env python3
"""Check a `kda quantize --type int4-g32` folder with compressed-tensors itself: for every
quantised projection, compressed-tensors' own `calculate_qparams` + `compress` of the HF
checkpoint's weight (widened to f32) must give the folder's `weight_packed`, `weight_scale`
and `weight_shape` bit for bit, and its `decompress` must be close to the weight; every other
tensor must be the checkpoint's. The config's `quantization_config` must parse as
compressed-tensors' own `QuantizationConfig`.

Versions: tests/scripts/requirements-ct-quant.txt. Usage: check_ct_folder.py HF_DIR OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import load_file


def main():
    hf_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    src = {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        src.update(load_file(f))
    got = load_file(out_dir / "model.safetensors")
    qc = QuantizationConfig.model_validate(json.loads((out_dir / "config.json").read_text())["quantization_config"])
    scheme = qc.config_groups["group_0"]
    args = scheme.weights
    bad = 0
    for name in sorted(k for k in got if k.endswith(".weight_packed")):
        base = name.removesuffix(".weight_packed")
        w = src[base + ".weight"].float()
        r, c = w.shape
        grp = w.reshape(r, c // args.group_size, args.group_size)
        scale, _ = calculate_qparams(grp.amin(-1), grp.amax(-1), args)
        ref = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale.to(torch.bfloat16)}, scheme)
        same = all(torch.equal(ref[k], got[f"{base}.{k}"]) for k in ("weight_packed", "weight_scale", "weight_shape"))
        sd = {k: got[f"{base}.{k}"] for k in ("weight_packed", "weight_scale", "weight_shape")}
        sd["weight_scale"] = sd["weight_scale"].float()
        deq = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]
        rel = ((deq - w).norm() / w.norm()).item()
        print(f"{base:<48} {'= compressed-tensors' if same else 'DIFFERS from compressed-tensors'}, rel-RMS {rel:.2e}")
        bad += not same
    for name in sorted(k for k in got if not k.rsplit(".", 1)[-1].startswith("weight_")):
        same = torch.equal(got[name], src[name].reshape(got[name].shape))
        print(f"{name:<48} {'= checkpoint' if same else 'DIFFERS from the checkpoint'}")
        bad += not same
    print("OK" if bad == 0 else f"{bad} problems")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
