#!/usr/bin/env python3
"""Golden fixtures for the KDA Rust workspace (see tests/fixtures/README.md).

Run from the repository root:
    /root/kda-venv/bin/python tests/scripts/gen_fixtures.py            # (re)write tests/fixtures/*.safetensors
    /root/kda-venv/bin/python tests/scripts/gen_fixtures.py --check    # float64 numpy re-check of the layer files

CPU only, fp32 compute, fixed seeds. The recurrence, the chunked reference and both decay gates are fla-core
0.6.0's own torch references (fla.ops.kda.naive / fla.ops.kda.gate); the layer glue (projections, short conv,
l2norm, gated RMSNorm) follows Kimi Linear's HF modeling code (spec section 9.2).
"""
import argparse
import importlib.metadata
import json
import math
import os
import struct
import sys
import zlib

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

FLA_VERSION = importlib.metadata.version("fla-core")
assert FLA_VERSION == "0.6.0", f"fixtures are pinned to fla-core 0.6.0, found {FLA_VERSION}"
from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda  # noqa: E402
from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate  # noqa: E402

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
L2_EPS, RMS_EPS, LOWER_BOUND = 1e-6, 1e-5, -5.0
VERSIONS = {"fla_version": FLA_VERSION, "torch_version": torch.__version__}

# name, decay gate, output gate, weight dtype, hid, H, K, cu_seqlens, W, initial states,
# A_log/dt_bias dtype for bf16 cases ("f32" like the K3 checkpoint, or "bf16")
CASES = [
    ("sp_lr_f32_k16_h3_t37", "softplus", "low_rank", "f32", 36, 3, 16, [0, 37], 4, True, None),
    ("lb_full_f32_k32_h4_t200_packed", "lower_bound", "full_rank", "f32", 50, 4, 32, [0, 1, 3, 200], 4, True, None),
    ("sp_full_bf16_k64_h1_t5", "softplus", "full_rank", "bf16", 100, 1, 64, [0, 5], 4, False, "f32"),
    ("lb_lr_bf16_k128_h1_t37_packed", "lower_bound", "low_rank", "bf16", 60, 1, 128, [0, 2, 3, 37], 4, True, "bf16"),
    ("sp_lr_f32_k128_h1_t200", "softplus", "low_rank", "f32", 44, 1, 128, [0, 200], 4, True, None),
    ("lb_lr_f32_k16_h1_t1", "lower_bound", "low_rank", "f32", 20, 1, 16, [0, 1], 4, True, None),
    ("sp_full_f32_k32_h3_t37_w2", "softplus", "full_rank", "f32", 30, 3, 32, [0, 1, 37], 2, True, None),
    ("lb_full_f32_k16_h4_t5_w1", "lower_bound", "full_rank", "f32", 24, 4, 16, [0, 2, 5], 1, True, None),
    ("sp_lr_bf16_k32_h3_t200_packed", "softplus", "low_rank", "bf16", 52, 3, 32, [0, 1, 3, 100, 200], 4, False, "f32"),
]


def seed_of(name):
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


# ----------------------------------------------------------------------------- building blocks (torch, fp32)

def l2norm(x):
    """fla's in-kernel form: x / sqrt(sum(x^2) + eps), eps inside the sqrt (not F.normalize)."""
    return x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) + L2_EPS))


def short_conv(x, w, state):
    """One sequence. x [T, D] raw inputs, w [D, 1, W], state [D, W-1] (oldest first).
    Returns silu(depthwise causal conv) [T, D] and the new state [D, W-1] = last W-1 columns of [state ; x]."""
    D, _, W = w.shape
    stream = torch.cat([state, x.t()], dim=1)                      # [D, W-1+T]
    y = F.conv1d(stream.unsqueeze(0), w, groups=D).squeeze(0)      # [D, T], no padding
    return F.silu(y).t().contiguous(), stream[:, stream.shape[1] - (W - 1):].contiguous()


def rmsnorm_gated(o, gate, weight):
    """Per row over the last dim: o * rsqrt(mean(o^2) + eps) * weight * sigmoid(gate)."""
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + RMS_EPS) * weight * torch.sigmoid(gate)


def decay_gate(form, f, A_log, dt_bias):
    if form == "softplus":
        return naive_kda_gate(f, A_log, dt_bias)
    return naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=LOWER_BOUND)


# ----------------------------------------------------------------------------- layer fixtures

def make_weights(hid, H, K, W, decay, out_gate):
    D = H * K

    def mat(o, i, s=1.0):
        return torch.randn(o, i) * (s / math.sqrt(i))

    w = {
        "q_proj.weight": mat(D, hid), "k_proj.weight": mat(D, hid), "v_proj.weight": mat(D, hid),
        "q_conv1d.weight": torch.randn(D, 1, W) * 0.5,
        "k_conv1d.weight": torch.randn(D, 1, W) * 0.5,
        "v_conv1d.weight": torch.randn(D, 1, W) * 0.5,
        "A_log": torch.log(torch.empty(H).uniform_(1.0, 16.0)),
    }
    dt = torch.exp(torch.empty(D).uniform_(math.log(1e-3), math.log(1e-1))).clamp_min(1e-4)
    w["dt_bias"] = dt + torch.log(-torch.expm1(-dt))              # softplus^-1(dt)
    w["f_a_proj.weight"] = mat(K, hid)
    f_b = mat(D, K)
    # per-channel scale 0.5..8 so the gates spread: softplus reaches |g| >> 1, lower_bound covers (-5, 0)
    f_b = f_b * torch.exp(torch.empty(D, 1).uniform_(math.log(0.5), math.log(8.0)))
    w["f_b_proj.weight"] = f_b
    w["b_proj.weight"] = mat(H, hid)
    if out_gate == "low_rank":
        w["g_a_proj.weight"], w["g_b_proj.weight"] = mat(K, hid), mat(D, K)
    else:
        w["g_proj.weight"] = mat(D, hid)
    w["o_norm.weight"] = 1.0 + 0.1 * torch.randn(K)
    w["o_proj.weight"] = mat(hid, D)
    return w


def layer_forward(w, x, cu, H, K, decay, out_gate, init):
    """Kimi Linear KDA layer on packed tokens. w: fp32 weights, x [T, hid], cu list of offsets.
    init: None or dict(rec [N,H,K,K], q/k/v conv states [N,D,W-1]). Returns (output, finals, intermediates)."""
    T, D, N = x.shape[0], H * K, len(cu) - 1
    W = w["q_conv1d.weight"].shape[-1]
    raw = {c: x @ w[f"{c}_proj.weight"].t() for c in "qkv"}
    conv = {c: torch.empty(T, D) for c in "qkv"}
    conv_fin = {c: torch.empty(N, D, W - 1) for c in "qkv"}
    for n in range(N):
        a, b = cu[n], cu[n + 1]
        for c in "qkv":
            st = init[c][n] if init is not None else torch.zeros(D, W - 1)
            conv[c][a:b], conv_fin[c][n] = short_conv(raw[c][a:b], w[f"{c}_conv1d.weight"], st)
    q = l2norm(conv["q"].view(T, H, K))
    k = l2norm(conv["k"].view(T, H, K))
    v = conv["v"].view(T, H, K)
    f = (x @ w["f_a_proj.weight"].t()) @ w["f_b_proj.weight"].t()
    g = decay_gate(decay, f.view(T, H, K), w["A_log"], w["dt_bias"])
    beta = torch.sigmoid(x @ w["b_proj.weight"].t())
    o = torch.empty(T, H, K)
    S_fin = torch.empty(N, H, K, K)
    for n in range(N):
        a, b = cu[n], cu[n + 1]
        S0 = init["rec"][n:n + 1] if init is not None else None
        o_n, S_n = naive_recurrent_kda(q[None, a:b], k[None, a:b], v[None, a:b], g[None, a:b], beta[None, a:b],
                                       scale=K ** -0.5, initial_state=S0, output_final_state=True)
        o[a:b], S_fin[n] = o_n[0], S_n[0]
    if out_gate == "low_rank":
        gate = (x @ w["g_a_proj.weight"].t()) @ w["g_b_proj.weight"].t()
    else:
        gate = x @ w["g_proj.weight"].t()
    gate = gate.view(T, H, K)
    y = rmsnorm_gated(o, gate, w["o_norm.weight"]).reshape(T, D)
    out = y @ w["o_proj.weight"].t()
    finals = {"final_recurrent_state": S_fin, "final_conv_state_q": conv_fin["q"],
              "final_conv_state_k": conv_fin["k"], "final_conv_state_v": conv_fin["v"]}
    inter = {"inter.q": q, "inter.k": k, "inter.v": v, "inter.g": g, "inter.beta": beta, "inter.o": o,
             "inter.gate": gate}
    return out, finals, inter


def gen_layer_case(case):
    name, decay, out_gate, wdt, hid, H, K, cu, W, has_init, gp_dt = case
    torch.manual_seed(seed_of(name))
    D, T, N = H * K, cu[-1], len(cu) - 1
    w = make_weights(hid, H, K, W, decay, out_gate)
    stored = {}
    for n_, t in w.items():
        keep_f32 = wdt == "f32" or (n_ in ("A_log", "dt_bias") and gp_dt == "f32")
        stored[n_] = t if keep_f32 else t.to(torch.bfloat16)
    w32 = {n_: t.float() for n_, t in stored.items()}            # reference uses the stored (rounded) values
    x = torch.randn(T, hid)
    init = None
    tensors = dict(stored)
    tensors["hidden_states"] = x
    tensors["cu_seqlens"] = torch.tensor(cu, dtype=torch.int64)
    if has_init:
        init = {"rec": torch.randn(N, H, K, K) * 0.5,
                "q": torch.randn(N, D, W - 1), "k": torch.randn(N, D, W - 1), "v": torch.randn(N, D, W - 1)}
        tensors["initial_recurrent_state"] = init["rec"]
        for c in "qkv":
            tensors[f"initial_conv_state_{c}"] = init[c]
    with torch.no_grad():
        out, finals, inter = layer_forward(w32, x, cu, H, K, decay, out_gate, init)
    tensors["output"] = out
    tensors.update(finals)
    tensors.update(inter)
    meta = {"hidden": str(hid), "heads": str(H), "head_dim": str(K), "conv_width": str(W), "decay_gate": decay,
            "output_gate": out_gate, "rms_eps": str(RMS_EPS), "l2_eps": str(L2_EPS), "weight_dtype": wdt,
            "case": name, **VERSIONS}
    if decay == "lower_bound":
        meta["lower_bound"] = str(LOWER_BOUND)
    if wdt == "bf16":
        meta["gate_param_dtype"] = gp_dt
    for t in tensors.values():
        assert torch.isfinite(t.float()).all()
    save(tensors, f"layer_{name}.safetensors", meta)
    g = inter["inter.g"]
    frac = (g < -1.0).float().mean()
    print(f"  {name}: T={T} N={N} D={D} g in [{g.min():.3g}, {g.max():.3g}] (g<-1: {frac:.0%}) "
          f"|out|rms={out.pow(2).mean().sqrt():.3g}")


# ----------------------------------------------------------------------------- component fixtures

def gen_components():
    torch.manual_seed(seed_of("components"))
    t = {}
    for form in ("softplus", "lower_bound"):
        Tn, H, K = 7, 3, 16
        raw = torch.randn(Tn, H, K) * 8.0
        raw[0, 0, :4] = torch.tensor([25.0, 30.0, 45.0, 80.0])        # x = raw + dt_bias > 20: threshold branch
        raw[1, 1, :4] = torch.tensor([-30.0, -60.0, -100.0, -200.0])  # very negative
        A_log = torch.log(torch.empty(H).uniform_(1.0, 16.0))
        dt = torch.exp(torch.empty(H * K).uniform_(math.log(1e-3), math.log(1e-1)))
        dt_bias = dt + torch.log(-torch.expm1(-dt))
        t[f"gate_{form}.raw"], t[f"gate_{form}.A_log"], t[f"gate_{form}.dt_bias"] = raw, A_log, dt_bias
        t[f"gate_{form}.out"] = decay_gate(form, raw, A_log, dt_bias)

    b = torch.randn(50) * 4.0
    b[:6] = torch.tensor([30.0, -30.0, 0.0, 15.0, -15.0, 88.0])
    t["beta.raw"], t["beta.out"] = b, torch.sigmoid(b)

    x = torch.randn(6, 32)
    x[2] = 0.0
    x[4] = x[4] / x[4].norm() * 1e-4
    x[5] = x[5] * 100.0
    t["l2norm.x"], t["l2norm.out"] = x, l2norm(x)

    cx, cw, cs = torch.randn(9, 24), torch.randn(24, 1, 4) * 0.5, torch.randn(24, 3)
    cy, cs1 = short_conv(cx, cw, cs)
    sx = torch.randn(24)
    sy, cs2 = short_conv(sx[None], cw, cs1)
    t.update({"conv.x": cx, "conv.weight": cw, "conv.state_in": cs, "conv.out": cy, "conv.state_out": cs1,
              "conv.step_x": sx, "conv.step_out": sy[0], "conv.step_state_out": cs2})

    ro, rg, rw = torch.randn(5, 3, 16), torch.randn(5, 3, 16) * 3.0, 1.0 + 0.1 * torch.randn(16)
    ro[1, 2] = 0.0                                                 # all-zero row -> output 0 (eps keeps it finite)
    t.update({"rmsnorm_gated.x": ro, "rmsnorm_gated.gate": rg, "rmsnorm_gated.weight": rw,
              "rmsnorm_gated.out": rmsnorm_gated(ro, rg, rw)})

    def kda_inputs(Tn, H, K, hard_gates):
        q, k = l2norm(torch.randn(1, Tn, H, K)), l2norm(torch.randn(1, Tn, H, K))
        v = torch.randn(1, Tn, H, K)
        g = F.logsigmoid(torch.randn(1, Tn, H, K) + 2.0)
        if hard_gates:
            g[0, 5, 0, :] = -1000.0                                # full reset of head 0
            g[0, 17, 1, ::3] = -1000.0                             # partial reset of head 1
            g[0, 9:13] = 0.0                                       # no decay
            g[0, 30, :, :8] = 0.0
        beta = torch.sigmoid(torch.randn(1, Tn, H))
        h0 = torch.randn(1, H, K, K) * 0.5
        return q, k, v, g, beta, h0

    q, k, v, g, beta, h0 = kda_inputs(40, 2, 32, True)
    o, ht = naive_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=h0, output_final_state=True)
    t.update({"recurrent.q": q, "recurrent.k": k, "recurrent.v": v, "recurrent.g": g, "recurrent.beta": beta,
              "recurrent.h0": h0, "recurrent.o": o, "recurrent.ht": ht})

    q, k, v, _, beta, h0 = kda_inputs(128, 2, 32, False)
    g = F.logsigmoid(torch.randn(1, 128, 2, 32))
    o, ht = naive_chunk_kda(q, k, v, g, beta, scale=None, initial_state=h0, output_final_state=True, chunk_size=64)
    t.update({"chunk.q": q, "chunk.k": k, "chunk.v": v, "chunk.g": g, "chunk.beta": beta, "chunk.h0": h0,
              "chunk.o": o, "chunk.ht": ht})
    for n_, v_ in t.items():
        assert torch.isfinite(v_).all(), n_
    save(t, "components.safetensors", {"rms_eps": str(RMS_EPS), "l2_eps": str(L2_EPS),
                                        "lower_bound": str(LOWER_BOUND), "chunk_size": "64", **VERSIONS})
    print(f"  components: {len(t)} tensors")


def save(tensors, fname, meta):
    """save_file, then sort the __metadata__ keys in the header (safetensors writes them in hash order) so that
    regenerating gives byte-identical files. Same keys and values, so the header length does not change."""
    os.makedirs(FIXTURES, exist_ok=True)
    path = os.path.join(FIXTURES, fname)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)
    with open(path, "r+b") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":")).encode()
        assert len(text) <= n
        fh.seek(8)
        fh.write(text + b" " * (n - len(text)))


# ----------------------------------------------------------------------------- independent float64 check

def np_check_layer(path):
    """Recompute a layer fixture from its stored inputs/weights in float64 numpy, without fla or torch math."""
    raw = load_file(path)
    a = {k: v.float().numpy().astype(np.float64) for k, v in raw.items() if k != "cu_seqlens"}
    cu = raw["cu_seqlens"].tolist()
    from safetensors import safe_open
    with safe_open(path, "np") as fh:
        meta = fh.metadata()
    H, K, W = int(meta["heads"]), int(meta["head_dim"]), int(meta["conv_width"])
    x = a["hidden_states"]
    T, D, N = x.shape[0], H * K, len(cu) - 1
    has_init = "initial_recurrent_state" in a
    sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
    y = {}
    fin = {c: np.zeros((N, D, W - 1)) for c in "qkv"}
    for c in "qkv":
        r = x @ a[f"{c}_proj.weight"].T
        wc = a[f"{c}_conv1d.weight"][:, 0, :]                        # [D, W]
        out = np.zeros((T, D))
        for n in range(N):
            s, e = cu[n], cu[n + 1]
            st = a[f"initial_conv_state_{c}"][n].T if has_init else np.zeros((W - 1, D))
            stream = np.concatenate([st, r[s:e]], 0)                 # [W-1+Tn, D]
            for t in range(e - s):
                out[s + t] = (stream[t:t + W] * wc.T).sum(0)
            fin[c][n] = stream[stream.shape[0] - (W - 1):].T
        y[c] = out * sig(out)
    nrm = lambda z: z / np.sqrt((z * z).sum(-1, keepdims=True) + 1e-6)  # noqa: E731
    q, k, v = nrm(y["q"].reshape(T, H, K)), nrm(y["k"].reshape(T, H, K)), y["v"].reshape(T, H, K)
    f = ((x @ a["f_a_proj.weight"].T) @ a["f_b_proj.weight"].T).reshape(T, H, K) + a["dt_bias"].reshape(H, K)
    A = np.exp(a["A_log"]).reshape(H, 1)
    if meta["decay_gate"] == "softplus":
        g = -A * np.logaddexp(0.0, f)
    else:
        g = float(meta["lower_bound"]) * sig(A * f)
    beta = sig(x @ a["b_proj.weight"].T)
    o = np.zeros((T, H, K))
    S_fin = np.zeros((N, H, K, K))
    for n in range(N):
        S = a["initial_recurrent_state"][n].copy() if has_init else np.zeros((H, K, K))
        for t in range(cu[n], cu[n + 1]):
            S = S * np.exp(g[t])[:, :, None]
            pred = np.einsum("hk,hkv->hv", k[t], S)
            S = S + beta[t][:, None, None] * k[t][:, :, None] * (v[t] - pred)[:, None, :]
            o[t] = np.einsum("hk,hkv->hv", q[t] * K ** -0.5, S)
        S_fin[n] = S
    if "g_proj.weight" in a:
        gate = x @ a["g_proj.weight"].T
    else:
        gate = (x @ a["g_a_proj.weight"].T) @ a["g_b_proj.weight"].T
    gate = gate.reshape(T, H, K)
    yn = o / np.sqrt((o * o).mean(-1, keepdims=True) + 1e-5) * a["o_norm.weight"] * sig(gate)
    out = yn.reshape(T, D) @ a["o_proj.weight"].T
    rel = lambda ref, got: float(np.sqrt(((ref - got) ** 2).mean() / max((ref ** 2).mean(), 1e-300)))  # noqa: E731
    res = {"output": rel(out, a["output"]), "final_recurrent_state": rel(S_fin, a["final_recurrent_state"]),
           "inter.g": rel(g, a["inter.g"]), "inter.o": rel(o, a["inter.o"])}
    if W > 1:
        res["final_conv_state"] = max(rel(fin[c], a[f"final_conv_state_{c}"]) for c in "qkv")
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="float64 numpy re-check of the stored layer fixtures")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.check:
        worst = 0.0
        for case in CASES:
            r = np_check_layer(os.path.join(FIXTURES, f"layer_{case[0]}.safetensors"))
            worst = max(worst, r["output"])
            print(f"  {case[0]:34s} " + "  ".join(f"{k}={v:.2e}" for k, v in r.items()))
        print(f"worst output rel-RMS: {worst:.2e}")
        sys.exit(0 if worst < 1e-5 else 1)
    print(f"fla-core {FLA_VERSION}, torch {torch.__version__}")
    for case in CASES:
        gen_layer_case(case)
    gen_components()


if __name__ == "__main__":
    main()
