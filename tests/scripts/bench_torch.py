#!/usr/bin/env python3
"""Times the same KDA layer in torch on CPU, for the side-by-side table in the README.

Not run in CI (it needs torch + fla-core; see requirements.txt). Run it with
`MALLOC_MMAP_MAX_=0` (without it, torch's big temporaries cost it 2-3x) and one thread to
compare with `kda bench --threads 1`:

    MALLOC_MMAP_MAX_=0 OMP_NUM_THREADS=1 /root/kda-venv/bin/python tests/scripts/bench_torch.py --threads 1

The layer is composed as in Kimi Linear's modelling code (spec section 9): bf16 weights, bf16
matmuls (what torch and vLLM run bf16 checkpoints at), fla's naive recurrence in fp32.
"""
import argparse
import time

import torch
import torch.nn.functional as F
from fla.ops.kda.naive import naive_recurrent_kda
from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate

PRESETS = {
    "kimi-linear": dict(hidden=2304, heads=32, k=128, lower_bound=None, full_gate=False),
    "kimi-k3": dict(hidden=7168, heads=96, k=128, lower_bound=-5.0, full_gate=True),
}


def make_layer(p, dtype):
    g = torch.Generator().manual_seed(0)
    d, hd, k = p["heads"] * p["k"], p["hidden"], p["k"]
    r = lambda *s: (torch.randn(*s, generator=g) / s[-1] ** 0.5).to(dtype)
    w = dict(q=r(d, hd), k=r(d, hd), v=r(d, hd), fa=r(k, hd), fb=r(d, k), b=r(p["heads"], hd), o=r(hd, d))
    if p["full_gate"]:
        w["g"] = r(d, hd)
    else:
        w["ga"], w["gb"] = r(k, hd), r(d, k)
    w["conv"] = [torch.randn(d, 4, generator=g) * 0.5 for _ in range(3)]
    w["A_log"] = torch.rand(p["heads"], generator=g) * 2
    w["dt_bias"] = torch.randn(d, generator=g) * 0.1
    w["o_norm"] = torch.ones(k)
    return w


def conv(x, w, state):
    # x [T, D] raw, state [D, 3]; returns silu(conv) and the new state.
    stream = torch.cat([state.t(), x], 0)  # [3+T, D]
    y = F.conv1d(stream.t().unsqueeze(0), w.unsqueeze(1), groups=w.shape[0])[0].t()
    return F.silu(y), stream[-3:].t().contiguous()


def layer(p, w, x, state, convs):
    t, k, h = x.shape[0], p["k"], p["heads"]
    mm = lambda a, b: (a.to(b.dtype) @ b.t()).float()
    q, convs[0] = conv(mm(x, w["q"]), w["conv"][0], convs[0])
    kk, convs[1] = conv(mm(x, w["k"]), w["conv"][1], convs[1])
    v, convs[2] = conv(mm(x, w["v"]), w["conv"][2], convs[2])
    f = mm(mm(x, w["fa"]), w["fb"]).view(t, h, k)
    if p["lower_bound"] is None:
        g = naive_kda_gate(f, w["A_log"], w["dt_bias"])
    else:
        g = naive_kda_lowerbound_gate(f, w["A_log"], w["dt_bias"], lower_bound=p["lower_bound"])
    beta = torch.sigmoid(mm(x, w["b"]))
    l2 = lambda z: z / torch.sqrt((z * z).sum(-1, keepdim=True) + 1e-6)
    q, kk, v = l2(q.view(t, h, k)), l2(kk.view(t, h, k)), v.view(t, h, k)
    o, state = naive_recurrent_kda(q[None], kk[None], v[None], g[None], beta[None], initial_state=state,
                                   output_final_state=True)
    gate = mm(x, w["g"]) if p["full_gate"] else mm(mm(x, w["ga"]), w["gb"])
    o = o[0]
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * w["o_norm"] * torch.sigmoid(gate.view(t, h, k))
    return mm(o.reshape(t, -1), w["o"]), state, convs


def bench(fn, reps):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=1024)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    for (name, p), dtype in [(kv, dt) for kv in PRESETS.items() for dt in (torch.float32, torch.bfloat16)]:
        w = make_layer(p, dtype)
        name = f"{name} ({str(dtype).replace('torch.', '')} weights)"
        d = p["heads"] * p["k"]
        fresh = lambda: (torch.zeros(1, p["heads"], p["k"], p["k"]), [torch.zeros(d, 3) for _ in range(3)])
        if name.startswith("kimi-linear"):
            x = torch.randn(args.prompt, p["hidden"])
            dt = bench(lambda: layer(p, w, x, *fresh()), 2)
            print(f"{name}: prefill T={args.prompt}: {dt:.3f} s ({args.prompt / dt:.0f} tokens/s)")
        x1 = torch.randn(1, p["hidden"])
        st, cv = fresh()
        dt = bench(lambda: layer(p, w, x1, st, cv), 10)
        print(f"{name}: decode batch 1: {dt * 1e3:.2f} ms/token")


if __name__ == "__main__":
    main()
