"""fla's Triton KDA kernels timed on the same GPU as kda-cuda's bench, for a side-by-side.

Usage (on a GPU machine with torch + triton, fla-core 0.6.0 importable):
    python3 kda-cuda/scripts/fla_gpu_bench.py [--quick] [--decode-only]

Shapes match `kda-cuda/examples/bench.rs`' "core" rows and its decode rows:
- prefill T = 8192, H = 96, K = V = 128, bf16, q/k L2-normalised in the kernel, with the gate
  given in log space (`g`) and with the gate computed in the kernel (`A_log`, `dt_bias`);
- decode of one token at batch 1 and 64 (`fused_recurrent_kda`, f32 state updated in place).
fla times the delta-rule kernels only: no projections, no short convolution, no output norm.
Each figure is the median of CUDA-event timings after warm-up calls (the first call autotunes).
"""

import argparse
import statistics
import sys
import time

import torch


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times)


def report(case, ms, best, tokens):
    print(
        f"| {case} | {ms:.3f} | {best:.3f} | {tokens / (ms / 1e3):.0f} |",
        flush=True,
    )


def prefill_inputs(t, h, k, dev):
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)

    q, kk, v = randn(1, t, h, k), randn(1, t, h, k), randn(1, t, h, k)
    g_raw = randn(1, t, h, k)
    g = torch.nn.functional.logsigmoid(g_raw.float()) / 16.0
    beta = torch.sigmoid(randn(1, t, h, dtype=torch.float32)).to(torch.bfloat16)
    a_log = torch.log(torch.rand(h, generator=gen, device=dev) * 15 + 1)
    dt_bias = torch.zeros(h * k, device=dev)
    return q, kk, v, g, g_raw, beta, a_log, dt_bias


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--decode-only", action="store_true", help="skip the prefill rows (their autotuning takes about a minute)")
    args = ap.parse_args()
    iters = 5 if args.quick else 20
    from fla.ops.kda import chunk_kda, fused_recurrent_kda

    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}; torch {torch.__version__}", flush=True)
    import fla
    import triton

    print(f"fla {getattr(fla, '__version__', '?')}, triton {triton.__version__}", flush=True)
    print()
    print("| fla case | ms / call (median) | best | tokens / s |")
    print("|---|---:|---:|---:|", flush=True)
    t, h, k = 8192, 96, 128
    if not args.decode_only:
        prefill(chunk_kda, t, h, k, dev, iters)
    decode(fused_recurrent_kda, h, k, dev, iters)


def prefill(chunk_kda, t, h, k, dev, iters):
    q, kk, v, g, g_raw, beta, a_log, dt_bias = prefill_inputs(t, h, k, dev)
    t0 = time.time()

    def plain():
        return chunk_kda(q, kk, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=True)

    ms, best = timed(plain, 3, iters)
    report("chunk_kda T=8192 H=96 K=128, g given", ms, best, t)
    print(f"(first case incl. autotune: {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)

    def gated():
        return chunk_kda(
            q, kk, v, g_raw, beta, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            A_log=a_log, dt_bias=dt_bias, output_final_state=True,
        )

    ms, best = timed(gated, 3, iters)
    report("chunk_kda T=8192 H=96 K=128, gate in kernel", ms, best, t)


def decode(fused_recurrent_kda, h, k, dev, iters):
    for batch in (1, 64):
        q, kk, v, g, _, beta, _, _ = prefill_inputs(batch, h, k, dev)
        # [1, batch, H, K] -> [batch, 1, H, K]: one token of each of `batch` sequences.
        dq, dk, dv, dg, db = (x.transpose(0, 1).contiguous() for x in (q, kk, v, g, beta))
        state = torch.zeros(batch, h, k, k, device=dev)

        def step():
            return fused_recurrent_kda(
                dq, dk, dv, dg, db, initial_state=state, output_final_state=True,
                use_qk_l2norm_in_kernel=True,
            )

        ms, best = timed(step, 5, iters * 10)
        state_bytes = 2 * state.numel() * 4  # f32 state read and written
        report(
            f"fused_recurrent_kda decode batch {batch} H=96 K=128: {ms * 1e3:.1f} µs, "
            f"state {state_bytes / 1e6:.1f} MB at {state_bytes / (ms / 1e3) / 1e9:.0f} GB/s",
            ms, best, batch,
        )


if __name__ == "__main__":
    main()
