#!/usr/bin/env python3
"""fla's reference output of the KDA layer of the converter-made GGUF fixture
(tests/fixtures/gguf/kimi-linear-tiny-q8_0.gguf, layer 0), on its weights as gguf-py
dequantises them: tests/fixtures/gguf/kimi-linear-tiny-q8_0-layer0.safetensors.

The weights are read and dequantised by gguf-py (`GGUFReader`, `gguf.quants.dequantize`), then
put back in Hugging Face form by inverting llama.cpp's converter (`conversion/kimi_linear.py`):
`A_log = ln(-ssm_a)` (in float64, rounded once to float32), the convs `[W, 1, P, 1]` (ne) as
`[P, 1, W]`, every other tensor as stored. The layer is gen_fixtures.py's `layer_forward` (fla-core
0.6.0's `naive_kda_gate` and `naive_recurrent_kda`, Kimi Linear's glue), fp32, on two packed
sequences (5 and 35 tokens) with random initial states. Stored: `hidden_states`, `cu_seqlens`,
the initial and final states, `output`, and metadata; not the weights (the GGUF holds them).

Versions: tests/scripts/requirements-gguf-layer.txt. Run from the repository root:
    python tests/scripts/gen_gguf_layer_fixture.py
"""
import importlib.metadata
import os
import sys

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402  (fla-core 0.6.0 pinned there)

GGUF = os.path.join(gf.FIXTURES, "gguf", "kimi-linear-tiny-q8_0.gguf")
OUT = "gguf/kimi-linear-tiny-q8_0-layer0.safetensors"
LAYER = 0
CU = [0, 5, 40]

# GGUF name (after blk.N.) -> HF name (after self_attn.)
NAMES = {
    "attn_q.weight": "q_proj.weight", "attn_k.weight": "k_proj.weight", "attn_v.weight": "v_proj.weight",
    "ssm_conv1d_q.weight": "q_conv1d.weight", "ssm_conv1d_k.weight": "k_conv1d.weight",
    "ssm_conv1d_v.weight": "v_conv1d.weight", "ssm_a": "A_log", "ssm_dt.bias": "dt_bias",
    "ssm_f_a.weight": "f_a_proj.weight", "ssm_f_b.weight": "f_b_proj.weight", "ssm_beta.weight": "b_proj.weight",
    "ssm_g_a.weight": "g_a_proj.weight", "ssm_g_b.weight": "g_b_proj.weight", "ssm_norm.weight": "o_norm.weight",
    "attn_output.weight": "o_proj.weight",
}


def field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else [f.parts[i].tolist()[0] for i in f.data]


def weights(reader):
    w = {}
    for t in reader.tensors:
        prefix = f"blk.{LAYER}."
        if not t.name.startswith(prefix) or t.name[len(prefix):] not in NAMES:
            continue
        hf = NAMES[t.name[len(prefix):]]
        v = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        ne = [int(d) for d in t.shape]  # gguf-py's shape is ne (contiguous first)
        if hf == "A_log":
            v = np.log(-v.astype(np.float64)).astype(np.float32).reshape(-1)
        elif hf.endswith("conv1d.weight"):
            v = v.reshape(ne[2], 1, ne[0])
        elif len(ne) == 2:
            v = v.reshape(ne[1], ne[0])
        else:
            v = v.reshape(-1)
        w[hf] = torch.from_numpy(np.array(v, dtype=np.float32, order="C", copy=True))
    assert len(w) == len(NAMES), sorted(set(NAMES.values()) - set(w))
    return w


def main():
    reader = GGUFReader(GGUF)
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "kimi-linear"
    K = field(reader, "kimi-linear.kda.head_dim")
    gf.RMS_EPS = float(np.float32(field(reader, "kimi-linear.attention.layer_norm_rms_epsilon")))
    w = weights(reader)
    H = w["A_log"].numel()
    D = w["q_proj.weight"].shape[1]
    W = w["q_conv1d.weight"].shape[-1]
    P, N, T = H * K, len(CU) - 1, CU[-1]
    torch.manual_seed(gf.seed_of("gguf-layer0"))
    x = torch.randn(T, D)
    init = {"rec": torch.randn(N, H, K, K) * 0.5,
            "q": torch.randn(N, P, W - 1), "k": torch.randn(N, P, W - 1), "v": torch.randn(N, P, W - 1)}
    with torch.no_grad():
        out, finals, _ = gf.layer_forward(w, x, CU, H, K, "softplus", "low_rank", init)
    tensors = {"hidden_states": x, "cu_seqlens": torch.tensor(CU, dtype=torch.int64),
               "initial_recurrent_state": init["rec"], "output": out, **finals}
    for c in "qkv":
        tensors[f"initial_conv_state_{c}"] = init[c]
    for t in tensors.values():
        assert torch.isfinite(t.float()).all()
    meta = {"gguf": os.path.basename(GGUF), "layer": str(LAYER), "hidden": str(D), "heads": str(H),
            "head_dim": str(K), "conv_width": str(W), "rms_eps": repr(gf.RMS_EPS), "l2_eps": str(gf.L2_EPS),
            "gguf_py_version": importlib.metadata.version("gguf"), **gf.VERSIONS}
    gf.save(tensors, OUT, meta)
    print(f"{OUT}: T={T} N={N} hidden {D}, {H} heads x {K}, |out|rms={out.pow(2).mean().sqrt():.3g}")


if __name__ == "__main__":
    main()
