#!/usr/bin/env python3
"""Write a tiny random Kimi Linear HF checkpoint (config.json + model.safetensors) for the GGUF
fixture in tests/fixtures/gguf/ (see the README there).

Two layers: layer 0 KDA, layer 1 MLA (full_attn_layers [2], 1-based); both with a dense MLP
(first_k_dense_replace = 2, so no MoE tensors). hidden 256, KDA 2 heads x 32, conv 4, MLA nope
32 / rope 32 / v 32 / kv_lora 64, MLP 32, vocab 32. Matrices are BF16; A_log, dt_bias and the
convs F32, as in the published checkpoints. Needs numpy only (the safetensors file is written by
hand, so BF16 works); numpy 2.2.6 was used. The output is the same for every run (seed 1234).

Usage: gguf_tiny_kimi_linear.py OUT_DIR
"""
import json
import struct
import sys
from pathlib import Path

import numpy as np

out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-kimi-linear")
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(1234)

D, H, K, CONV = 256, 2, 32, 4
P = H * K
L = 2
V = 32
FF = 32
MLA_NOPE, MLA_ROPE, MLA_V, KV_LORA = 32, 32, 32, 64
full_attn = [2]  # 1-based: layer 1 (0-based) is MLA
kda = [i + 1 for i in range(L) if (i + 1) not in full_attn]

config = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "dtype": "bfloat16",
    "vocab_size": V,
    "hidden_size": D,
    "head_dim": 72,  # legacy field, as in the published config
    "num_hidden_layers": L,
    "num_attention_heads": H,
    "num_key_value_heads": H,
    "intermediate_size": FF,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    "q_lora_rank": None,
    "kv_lora_rank": KV_LORA,
    "qk_nope_head_dim": MLA_NOPE,
    "qk_rope_head_dim": MLA_ROPE,
    "v_head_dim": MLA_V,
    "mla_use_nope": True,
    # The converter writes these keys whether or not a layer uses experts.
    "num_experts": 4,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 32,
    "first_k_dense_replace": L,
    "moe_layer_freq": 1,
    "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True,
    "routed_scaling_factor": 2.446,
    "use_grouped_topk": True,
    "num_expert_group": 1,
    "topk_group": 1,
    "num_nextn_predict_layers": 0,
    "linear_attn_config": {
        "full_attn_layers": full_attn,
        "kda_layers": kda,
        "num_heads": H,
        "head_dim": K,
        "short_conv_kernel_size": CONV,
    },
}

tensors = {}  # name -> (dtype, float32 array)


def w(name, *shape, scale=0.05, dtype="BF16"):
    tensors[name] = (dtype, (rng.standard_normal(shape) * scale).astype(np.float32))


def f32(name, arr):
    tensors[name] = ("F32", np.asarray(arr, dtype=np.float32))


def norm(name, n):
    tensors[name] = ("BF16", (1 + 0.01 * rng.standard_normal(n)).astype(np.float32))


w("model.embed_tokens.weight", V, D)
w("lm_head.weight", V, D)
norm("model.norm.weight", D)
for i in range(L):
    p = f"model.layers.{i}."
    norm(p + "input_layernorm.weight", D)
    norm(p + "post_attention_layernorm.weight", D)
    a = p + "self_attn."
    if (i + 1) in kda:
        for x in "qkv":
            w(a + f"{x}_proj.weight", P, D)
            w(a + f"{x}_conv1d.weight", P, 1, CONV, scale=0.3, dtype="F32")
        f32(a + "A_log", np.log(rng.uniform(1, 16, H)).reshape(1, 1, H, 1))
        f32(a + "dt_bias", rng.standard_normal(P) * 0.1)
        w(a + "f_a_proj.weight", K, D)
        w(a + "f_b_proj.weight", P, K)
        w(a + "b_proj.weight", H, D)
        w(a + "g_a_proj.weight", K, D)
        w(a + "g_b_proj.weight", P, K)
        norm(a + "o_norm.weight", K)
        w(a + "o_proj.weight", D, P)
    else:
        w(a + "q_proj.weight", H * (MLA_NOPE + MLA_ROPE), D)
        w(a + "kv_a_proj_with_mqa.weight", KV_LORA + MLA_ROPE, D)
        tensors[a + "kv_a_layernorm.weight"] = ("BF16", np.ones(KV_LORA, np.float32))
        w(a + "kv_b_proj.weight", H * (MLA_NOPE + MLA_V), KV_LORA)
        w(a + "o_proj.weight", D, H * MLA_V)
    w(p + "mlp.gate_proj.weight", FF, D)
    w(p + "mlp.up_proj.weight", FF, D)
    w(p + "mlp.down_proj.weight", D, FF)


def to_bf16_bytes(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
    return u.astype(np.uint16).tobytes()


header, blobs, off = {}, [], 0
for name in sorted(tensors):
    dt, arr = tensors[name]
    raw = to_bf16_bytes(arr) if dt == "BF16" else arr.astype("<f4").tobytes()
    header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
    blobs.append(raw)
    off += len(raw)
hjson = json.dumps(header, separators=(",", ":")).encode()
hjson += b" " * ((8 - len(hjson) % 8) % 8)
with open(out / "model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hjson)))
    f.write(hjson)
    for b in blobs:
        f.write(b)
(out / "config.json").write_text(json.dumps(config, indent=2))
print(f"wrote {out} ({len(tensors)} tensors, {off} data bytes)")
