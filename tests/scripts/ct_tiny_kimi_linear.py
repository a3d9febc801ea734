#!/usr/bin/env python3
"""Write tiny compressed-tensors `pack-quantized` Kimi Linear HF folders for
tests/fixtures/ct/ (see the README there), with compressed-tensors' own compressor.

One layer, a KDA layer (hidden 64, 1 head x 32, conv 4, low-rank gates of rank 32) with a dense
MLP (32) and a vocabulary of 16. Random bf16 weights (seed 4321). Every nn.Linear is quantised
by compressed-tensors' `PackedQuantizationCompressor.compress` (its `calculate_qparams` makes
the scales and zero points from each group's min / max, as a static observer would), except
`lm_head` and the `b_proj` matrices (`ignore`), which stay bf16:

  int4-g32-sym/        int4, group 32, symmetric, bf16 scales (the Kimi K2-Thinking scheme)
  int8-g32-asym/       int8, group 32, asymmetric (zero points), f32 scales
  int4-channel-asym/   int4, one scale per row (channel), asymmetric, f16 scales

Each folder has config.json (with the `quantization_config` compressed-tensors writes) and
model.safetensors, plus reference.safetensors beside it: for every quantised matrix `M` of the
KDA layer (`self_attn`),
`M.weight` = `PackedQuantizationCompressor.decompress` of the stored tensors with the scales
widened to f32 (exact: the quants times the scale, unrounded), and for the bf16-scale folder
also `M.weight_bf16` = the same decompression with the scales as stored (compressed-tensors'
result rounded to bf16).

Needs tests/scripts/requirements-ct.txt. Usage: ct_tiny_kimi_linear.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils import calculate_qparams
from safetensors.torch import save_file

out = Path(sys.argv[1] if len(sys.argv) > 1 else "ct-tiny-kimi-linear")
D, H, K, CONV, V, FF = 64, 1, 32, 4, 16, 32
P = H * K
IGNORE = ["lm_head", r"re:.*\.b_proj$"]

base_config = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "dtype": "bfloat16",
    "vocab_size": V,
    "hidden_size": D,
    "num_hidden_layers": 1,
    "num_attention_heads": H,
    "num_key_value_heads": H,
    "intermediate_size": FF,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "first_k_dense_replace": 1,
    "linear_attn_config": {
        "full_attn_layers": [],
        "kda_layers": [1],
        "num_heads": H,
        "head_dim": K,
        "short_conv_kernel_size": CONV,
    },
}


def make_weights():
    g = torch.Generator().manual_seed(4321)

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    t = {}
    t["model.embed_tokens.weight"] = rnd(V, D)
    t["lm_head.weight"] = rnd(V, D)
    t["model.norm.weight"] = (1 + rnd(D, scale=0.01).float()).to(torch.bfloat16)
    p = "model.layers.0."
    t[p + "input_layernorm.weight"] = torch.ones(D, dtype=torch.bfloat16)
    t[p + "post_attention_layernorm.weight"] = torch.ones(D, dtype=torch.bfloat16)
    a = p + "self_attn."
    for x in "qkv":
        t[a + f"{x}_proj.weight"] = rnd(P, D)
        t[a + f"{x}_conv1d.weight"] = (torch.randn(P, 1, CONV, generator=g) * 0.3).float()
    t[a + "A_log"] = torch.log(torch.rand(1, 1, H, 1, generator=g) * 15 + 1).float()
    t[a + "dt_bias"] = (torch.randn(P, generator=g) * 0.1).float()
    t[a + "f_a_proj.weight"] = rnd(K, D)
    t[a + "f_b_proj.weight"] = rnd(P, K)
    t[a + "b_proj.weight"] = rnd(H, D)
    t[a + "g_a_proj.weight"] = rnd(K, D)
    t[a + "g_b_proj.weight"] = rnd(P, K)
    t[a + "o_norm.weight"] = torch.ones(K, dtype=torch.bfloat16)
    t[a + "o_proj.weight"] = rnd(D, P)
    t[p + "mlp.gate_proj.weight"] = rnd(FF, D)
    t[p + "mlp.up_proj.weight"] = rnd(FF, D)
    t[p + "mlp.down_proj.weight"] = rnd(D, FF)
    return t


def linear_modules(t):
    # Every 2-D `.weight` but the embedding and the norms is an nn.Linear in the HF model.
    mods = []
    for n, w in t.items():
        if n.endswith(".weight") and w.ndim == 2 and "embed_tokens" not in n:
            mods.append(n[: -len(".weight")])
    return sorted(mods)


def ignored(module):
    import re

    return any(
        re.match(i[3:], module) if i.startswith("re:") else i == module for i in IGNORE
    )


def compress_folder(name, args: QuantizationArgs, scale_dtype):
    t = make_weights()
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    model, ref = {}, {}
    for n in list(t):
        if not n.endswith(".weight") or n[: -len(".weight")] not in linear_modules(t):
            model[n] = t[n]
    for m in linear_modules(t):
        w = t[m + ".weight"]
        if ignored(m):
            model[m + ".weight"] = w
            continue
        rows, cols = w.shape
        g = args.group_size or cols  # the channel strategy: one group a row
        grp = w.float().reshape(rows, cols // g, g)
        scale, zp = calculate_qparams(grp.amin(-1), grp.amax(-1), args)
        sd = {"weight": w.float(), "weight_scale": scale.to(scale_dtype)}
        if not args.symmetric:
            sd["weight_zero_point"] = zp.round().to(torch.int8)
        c = PackedQuantizationCompressor.compress(sd, scheme)
        for k, v in c.items():
            model[f"{m}.{k}"] = v
        if ".self_attn." not in m:
            continue  # kda reads the KDA layer only
        exact = dict(c)
        exact["weight_scale"] = c["weight_scale"].float()
        ref[m + ".weight"] = PackedQuantizationCompressor.decompress(exact, scheme)["weight"]
        if scale_dtype == torch.bfloat16:
            native = PackedQuantizationCompressor.decompress(dict(c), scheme)["weight"]
            ref[m + ".weight_bf16"] = native
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    config = dict(base_config)
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": json.loads(args.model_dump_json()),
                "input_activations": None,
                "output_activations": None,
                "format": "pack-quantized",
            }
        },
        "ignore": IGNORE,
        "kv_cache_scheme": None,
    }
    (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in sorted(model.items())}, d / "model.safetensors")
    save_file({k: v.contiguous() for k, v in sorted(ref.items())}, d / "reference.safetensors")
    print(f"wrote {d} ({len(model)} tensors, {len(ref)} reference tensors)")


compress_folder(
    "int4-g32-sym",
    QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32),
    torch.bfloat16,
)
compress_folder(
    "int8-g32-asym",
    QuantizationArgs(num_bits=8, type="int", symmetric=False, strategy="group", group_size=32),
    torch.float32,
)
compress_folder(
    "int4-channel-asym",
    QuantizationArgs(num_bits=4, type="int", symmetric=False, strategy="channel"),
    torch.float16,
)
