#!/usr/bin/env python3
"""`kda quantize` against llama.cpp's own `llama-quantize`, end to end, for every --type.

1. Writes a seeded Kimi Linear HF checkpoint (numpy only): 20 layers, 17 KDA (full attention
   at 1-based 5, 10, 15; their tensors are not needed), hidden 256, 2 heads x 128, conv 4,
   low-rank gates of rank 128; bf16 matrices, F32 A_log / dt_bias / convs, bf16 o_norm.
2. Writes its KDA tensors as an F32 GGUF with the converter's names and transforms (gguf-py's
   GGUFWriter), layers in order, with every kimi-linear key llama.cpp's loader asks for (the
   keys of tests/fixtures/gguf/kimi-linear-tiny-q8_0.gguf, the dims of this model).
3. Runs `llama-quantize` on it (Q8_0, Q6_K, Q4_K_M, and `--pure Q4_K_M`) and `kda quantize`
   on the checkpoint (q8_0, q6_k, q4_k_m, q4_k), and compares every tensor (type, shape,
   bytes) and every key both files hold.
4. Runs `llama-quantize --allow-requantize` on each kda file: llama.cpp's model loader
   (architecture, hyperparameters, tensors) must accept it.

llama-quantize quantises F32 input with ggml's reference quantisers when no importance matrix
is given; it is built from the llama-cpp-python 0.3.36 sdist (vendor/llama.cpp) with
`cmake -S . -B build -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF && cmake --build build --target
llama-quantize`. Versions: tests/scripts/requirements-quant.txt.

Usage: llama_quantize_check.py LLAMA_QUANTIZE KDA WORK_DIR
  (LLAMA_QUANTIZE: the built binary; KDA: target/release/kda or target/debug/kda)
Exits 1 on any difference.
"""
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFReader, GGUFWriter

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from check_quantized_gguf import compare  # noqa: E402

L, D, H, K, W = 20, 256, 2, 128, 4
P, R = H * K, 128
FULL = [5, 10, 15]  # 1-based
KDA = [i for i in range(L) if i + 1 not in FULL]
NAMES = [  # (HF suffix, GGUF suffix)
    ("q_proj.weight", "attn_q.weight"), ("k_proj.weight", "attn_k.weight"),
    ("v_proj.weight", "attn_v.weight"), ("q_conv1d.weight", "ssm_conv1d_q.weight"),
    ("k_conv1d.weight", "ssm_conv1d_k.weight"), ("v_conv1d.weight", "ssm_conv1d_v.weight"),
    ("A_log", "ssm_a"), ("dt_bias", "ssm_dt.bias"), ("f_a_proj.weight", "ssm_f_a.weight"),
    ("f_b_proj.weight", "ssm_f_b.weight"), ("b_proj.weight", "ssm_beta.weight"),
    ("g_a_proj.weight", "ssm_g_a.weight"), ("g_b_proj.weight", "ssm_g_b.weight"),
    ("o_norm.weight", "ssm_norm.weight"), ("o_proj.weight", "attn_output.weight"),
]
PAIRS = [("q8_0", ["Q8_0"]), ("q6_k", ["Q6_K"]), ("q4_k_m", ["Q4_K_M"]), ("q4_k", ["--pure", "Q4_K_M"])]


def bf16(x):
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def layer_tensors(rng):
    def mat(rows, cols):
        return ("BF16", bf16(rng.normal(0, 1 / np.sqrt(cols), (rows, cols))))

    return {
        "q_proj.weight": mat(P, D), "k_proj.weight": mat(P, D), "v_proj.weight": mat(P, D),
        "q_conv1d.weight": ("F32", rng.normal(0, 0.5, (P, 1, W)).astype(np.float32)),
        "k_conv1d.weight": ("F32", rng.normal(0, 0.5, (P, 1, W)).astype(np.float32)),
        "v_conv1d.weight": ("F32", rng.normal(0, 0.5, (P, 1, W)).astype(np.float32)),
        "A_log": ("F32", np.log(rng.uniform(1, 16, (1, 1, H, 1))).astype(np.float32)),
        "dt_bias": ("F32", rng.normal(-4, 1, P).astype(np.float32)),
        "f_a_proj.weight": mat(R, D), "f_b_proj.weight": mat(P, R), "b_proj.weight": mat(H, D),
        "g_a_proj.weight": mat(R, D), "g_b_proj.weight": mat(P, R),
        "o_norm.weight": ("BF16", bf16(1 + 0.1 * rng.normal(0, 1, K))),
        "o_proj.weight": mat(D, P),
    }


def write_checkpoint(d):
    rng = np.random.default_rng(2046)
    d.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        "hidden_size": D, "num_hidden_layers": L, "num_attention_heads": H,
        "rms_norm_eps": 1e-5, "vocab_size": 32, "max_position_embeddings": 4096,
        "intermediate_size": 32, "rope_theta": 10000.0, "head_dim": 72, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 32, "v_head_dim": 32, "num_experts": 4,
        "num_experts_per_token": 2, "topk_group": 1, "num_shared_experts": 1,
        "moe_intermediate_size": 32, "first_k_dense_replace": 2,
        "moe_router_activation_func": "sigmoid", "routed_scaling_factor": 2.446,
        "linear_attn_config": {"num_heads": H, "head_dim": K, "short_conv_kernel_size": W,
                               "kda_layers": [i + 1 for i in KDA], "full_attn_layers": FULL},
    }
    (d / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {}
    for i in KDA:
        for k, v in layer_tensors(rng).items():
            tensors[f"model.layers.{i}.self_attn.{k}"] = v
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        dt, a = tensors[name]
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return tensors


def f32(dt, a):
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def write_f32_gguf(path, tensors):
    template = GGUFReader(HERE.parent / "fixtures" / "gguf" / "kimi-linear-tiny-q8_0.gguf")
    w = GGUFWriter(str(path), "kimi-linear")
    arch = "kimi-linear."
    override = {
        arch + "block_count": L, arch + "embedding_length": D, arch + "attention.head_count": H,
        arch + "kda.head_dim": K, arch + "ssm.conv_kernel": W, "general.file_type": 0,
    }
    for k, f in template.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if k == arch + "attention.head_count_kv":
            w.add_array(k, [0 if i in KDA else 1 for i in range(L)])
            continue
        v = override.get(k, f.contents())
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        else:
            w.add_key_value(k, v, vt)
    for i in KDA:
        for hf, gg in NAMES:
            dt, a = tensors[f"model.layers.{i}.self_attn.{hf}"]
            x = f32(dt, a)
            if hf == "A_log":
                x = -np.exp(x.astype(np.float64)).astype(np.float32)
                x = x.reshape(1, 1, H, 1)
            elif "conv1d" in hf:
                x = x.reshape(1, P, 1, W)
            w.add_tensor(f"blk.{i}.{gg}", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    lq, kda, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    tensors = write_checkpoint(work / "hf")
    src = work / "kda-layers-f32.gguf"
    write_f32_gguf(src, tensors)
    bad = 0
    for ours, theirs in PAIRS:
        ref = work / f"llama-quantize-{ours}.gguf"
        mine = work / f"kda-{ours}.gguf"
        subprocess.run([lq, *theirs[:-1], str(src), str(ref), theirs[-1]], check=True,
                       capture_output=True)
        subprocess.run([kda, "quantize", "--model", str(work / "hf"), "--out", str(mine),
                        "--type", ours], check=True)
        print(f"== kda quantize --type {ours} vs llama-quantize {' '.join(theirs)}")
        n = compare(GGUFReader(mine), GGUFReader(ref), verbose=False)
        print(f"   {len(GGUFReader(mine).tensors)} tensors, {n} differences")
        bad += n
        # llama.cpp's loader takes kda's file as it is: llama-quantize re-quantises it.
        again = work / f"kda-{ours}-requantized.gguf"
        rq = subprocess.run([lq, "--allow-requantize", str(mine), str(again), "Q8_0"], capture_output=True)
        print(f"   llama-quantize --allow-requantize on kda's file: rc {rq.returncode}")
        bad += rq.returncode != 0
    print("OK" if bad == 0 else f"{bad} differences")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
