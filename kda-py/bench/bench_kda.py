"""Benchmark of the Python package kda (not run in CI).

1. Prefill: ``kda.chunk_kda`` vs fla-core 0.6.0's ``naive_chunk_kda`` / ``naive_recurrent_kda``
   and transformers' torch fallbacks (``chunk_kimi_delta_attention`` /
   ``recurrent_kimi_delta_attention``, what Kimi Linear runs on CPU without fla), at
   T = 4096, H = 32, K = V = 128, one thread everywhere. Every function runs once untimed
   first (a first call pays for fresh pages and the thread pool), except the chunked torch
   forms (10-70 s a call, which such costs do not move). The token-by-token references (about
   2 s each) are then timed in rounds, each round timing ``kda.chunk_kda`` (best of 3) and then
   each reference once, so that every ratio is taken within one round: the shared machines
   this runs on change speed from one minute to the next. Reported: each round's ratio, and
   the median and minimum over the rounds.
2. Decode: ``kda.fused_recurrent_kda`` for one token at H = 96 (state in, state out): the
   time of the whole Python call vs the time spent in the Rust kernel (``delta::run``, timed
   by the extension in the same call), i.e. the call overhead; median of many calls. The
   time to free the returned tensors (when the caller drops them) is reported apart.

glibc's malloc: the torch references allocate a 2 MB state per token; with glibc's default
mmap threshold each is a fresh mmap whose pages fault in (fla's ``naive_recurrent_kda`` was
measured at 7.7-11.8 s that way instead of 2.0-2.6 s). The script turns mmap off for the
prefill (``mallopt(M_MMAP_MAX, 0)``, like ``MALLOC_MMAP_MAX_=0``), so the references run at
their fastest, and back to glibc's default for the decode measurement.

Run in the CI venv (see .ci/python.sh):  python kda-py/bench/bench_kda.py [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import inspect
import statistics
import time
import warnings

import torch

import kda


def mmap_max(n):
    """glibc's ``M_MMAP_MAX``: 0 serves every allocation from the heap, 65536 is the default.
    Returns whether it was set (False off glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.mallopt(-4, n) == 1  # M_MMAP_MAX
    except (OSError, AttributeError):
        return False


def once(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timed(fn, repeat):
    return min(once(fn) for _ in range(repeat))


def prefill(T, H, K, rounds):
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
    chunk = lambda: kda.chunk_kda(q, k, v, g, beta, output_final_state=True, threads=1)
    fused = lambda: kda.fused_recurrent_kda(q, k, v, g, beta, output_final_state=True, threads=1)
    token_refs = [
        ("fla naive_recurrent_kda", lambda: naive_recurrent_kda(q, k, v, g, beta, output_final_state=True)),
        ("transformers torch recurrent",
         lambda: hf_rec(q, k, v, g=g, beta=beta, initial_state=None, output_final_state=True)),
    ]
    chunked_refs = [
        ("fla naive_chunk_kda", lambda: naive_chunk_kda(q, k, v, g, beta, output_final_state=True)),
        ("transformers torch chunk", lambda: hf_chunk(q, k, v, g=g, beta=beta, output_final_state=True)),
    ]
    print(f"\nprefill T={T} H={H} K=V={K}, 1 thread (torch.set_num_threads(1), kda threads=1)")
    with torch.no_grad():
        for fn in [chunk, fused] + [fn for _, fn in token_refs]:
            fn()  # warm-up, untimed
        ratios = {name: [] for name, _ in token_refs}
        best = float("inf")
        for r in range(rounds):
            ours = timed(chunk, 3)
            best = min(best, ours)
            line = f"  round {r + 1}/{rounds}: kda.chunk_kda {ours * 1e3:7.1f} ms"
            for name, fn in token_refs:
                ref = once(fn)
                ratios[name].append(ref / ours)
                line += f" | {name} {ref * 1e3:7.1f} ms = {ref / ours:5.1f}x"
            print(line, flush=True)
        for name, rs in ratios.items():
            print(f"  {name:30s} {statistics.median(rs):5.1f}x kda.chunk_kda's time "
                  f"(median of {len(rs)} rounds; min {min(rs):.1f}x, max {max(rs):.1f}x)")
        print(f"  {'kda.chunk_kda':30s} {best * 1e3:8.1f} ms best of {3 * rounds}")
        s = timed(fused, 3)
        print(f"  {'kda.fused_recurrent_kda':30s} {s * 1e3:8.1f} ms   {s / best:5.1f}x kda.chunk_kda's best")
        for name, fn in chunked_refs:
            s = once(fn)
            print(f"  {name:30s} {s * 1e3:8.1f} ms   {s / best:5.1f}x kda.chunk_kda's best (one run)")


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
    ap.add_argument("--quick", action="store_true", help="T=1024 and one round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of the token-by-token references")
    ap.add_argument("--decode", action="store_true", help="the decode measurement only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.decode:
        print(f"glibc mmap off during prefill (the references' fastest setting): {mmap_max(0)}")
        prefill(1024 if args.quick else 4096, 32, 128, 1 if args.quick else max(1, args.rounds))
        mmap_max(65536)
    decode(96, 128, 50 if args.quick else 1000)


if __name__ == "__main__":
    main()
