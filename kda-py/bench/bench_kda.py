"""Benchmark of the Python package kda (not run in CI).

1. Prefill: ``kda.chunk_kda`` vs fla-core 0.6.0's ``naive_chunk_kda`` / ``naive_recurrent_kda``
   and transformers' torch fallbacks (``chunk_kimi_delta_attention`` /
   ``recurrent_kimi_delta_attention``, what Kimi Linear runs on CPU without fla), at
   T = 4096, H = 32, K = V = 128, one thread everywhere.
2. Decode: ``kda.fused_recurrent_kda`` for one token at H = 96 (state in, state out): the
   time of the whole Python call vs the time spent in the Rust kernel (``delta::run``, timed
   by the extension in the same call), i.e. the call overhead; median of many calls. The
   time to free the returned tensors (when the caller drops them) is reported apart.

Run in the CI venv (see .ci/python.sh):  python kda-py/bench/bench_kda.py [--quick]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
import warnings

import torch

import kda


def timed(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def prefill(T, H, K, repeat_slow):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fla.ops.kda.naive import naive_chunk_kda, naive_recurrent_kda
        from transformers.models.kimi_linear import modeling_kimi_linear as m
    hf_chunk = inspect.unwrap(m.chunk_kimi_delta_attention)
    hf_rec = inspect.unwrap(m.recurrent_kimi_delta_attention)
    g0 = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=g0), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, generator=g0), dim=-1)
    v = torch.randn(1, T, H, K, generator=g0)
    g = -torch.rand(1, T, H, K, generator=g0) * 0.1
    beta = torch.rand(1, T, H, generator=g0)
    # The token-by-token references (about 2 s each) take their best of `repeat_slow`, like
    # kda's functions; the chunked torch forms (10-60 s) run once.
    rows = [
        ("kda.chunk_kda", lambda: kda.chunk_kda(q, k, v, g, beta, output_final_state=True, threads=1), 3),
        ("kda.fused_recurrent_kda", lambda: kda.fused_recurrent_kda(q, k, v, g, beta, output_final_state=True, threads=1), 3),
        ("fla naive_chunk_kda", lambda: naive_chunk_kda(q, k, v, g, beta, output_final_state=True), 1),
        ("fla naive_recurrent_kda", lambda: naive_recurrent_kda(q, k, v, g, beta, output_final_state=True), repeat_slow),
        ("transformers torch chunk", lambda: hf_chunk(q, k, v, g=g, beta=beta, output_final_state=True), 1),
        ("transformers torch recurrent", lambda: hf_rec(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True), repeat_slow),
    ]
    print(f"\nprefill T={T} H={H} K=V={K}, 1 thread (torch.set_num_threads(1), kda threads=1)")
    base = None
    with torch.no_grad():
        for name, fn, rep in rows:
            s = timed(fn, rep)
            base = base or s
            print(f"  {name:30s} {s * 1e3:10.1f} ms   {s / base:7.1f}x kda.chunk_kda's time")


def decode(H, K, repeat):
    g0 = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, H, K, generator=g0)
    k = torch.randn(1, 1, H, K, generator=g0)
    v = torch.randn(1, 1, H, K, generator=g0)
    g = torch.randn(1, 1, H, K, generator=g0)
    beta = torch.randn(1, 1, H, generator=g0)
    a_log = torch.randn(H, generator=g0)
    dt_bias = torch.randn(H * K, generator=g0)
    h0 = torch.randn(1, H, K, K, generator=g0)
    print(f"\ndecode: fused_recurrent_kda, 1 token, H={H} K=V={K}, state in and out, 1 thread")
    for label, conv in (("torch f32", lambda t: t), ("numpy f32", lambda t: t.numpy())):
        args = [conv(t) for t in (q, k, v, g, beta)]
        kw = dict(initial_state=conv(h0), output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, A_log=conv(a_log),
                  dt_bias=conv(dt_bias), threads=1)
        calls, kernels, frees = [], [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            r = kda.fused_recurrent_kda(*args, **kw)
            t1 = time.perf_counter()
            del r  # freeing the outputs is the caller's, timed apart
            frees.append(time.perf_counter() - t1)
            calls.append(t1 - t0)
            kernels.append(kda.last_compute_seconds())
        call, kern = statistics.median(calls), statistics.median(kernels)
        over = [c - k for c, k in zip(calls, kernels)]
        print(f"  {label}: call {call * 1e6:8.1f} us, Rust kernel {kern * 1e6:8.1f} us, "
              f"overhead median {statistics.median(over) * 1e6:6.1f} us (min {min(over) * 1e6:5.1f} us); "
              f"freeing the outputs afterwards {statistics.median(frees) * 1e6:4.1f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="T=1024 and one run of each reference")
    ap.add_argument("--decode", action="store_true", help="the decode measurement only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.decode:
        prefill(1024 if args.quick else 4096, 32, 128, 1 if args.quick else 3)
    decode(96, 128, 50 if args.quick else 1000)


if __name__ == "__main__":
    main()
