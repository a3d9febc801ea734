//! Chunked vs recurrent delta rule for one head at the Kimi Linear head shape (K = V = 128),
//! one thread, T ∈ {256, 1024, 4096}, next to this CPU's single-core f32 FMA peak measured in
//! the same run.
//!
//! Also the chunked form's small GEMMs at their shapes (`chunk_gemm_C16`).
//!
//! Work unit: 4·K·V FMAs per token (decay, predict, write, read), whatever the algorithm does;
//! criterion's "elem/s" is therefore FMA/s and comparable with the peak group's.
//!
//! `KDA_BENCH_ISA=avx2` (or any name `Isa::name` prints) runs the kernels and the peak on that
//! path instead of the fastest one, e.g. the AVX2 path on an AVX-512 machine.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kda_core::internals::gemm_acc;
use kda_core::ops::chunked::{chunked_head, chunked_scratch_len, Chunks};
use kda_core::ops::recurrent::{recurrent_head, recurrent_scratch_len};
use kda_core::ops::HeadRows;
use kda_core::Isa;

const K: usize = 128;

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

fn inputs(t: usize) -> Inputs {
    let mut s = 12345u64;
    let mut r = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let mut unit = |n: usize| {
        let mut x: Vec<f32> = (0..n).map(|_| r()).collect();
        for row in x.chunks_mut(K) {
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt();
            row.iter_mut().for_each(|v| *v /= norm);
        }
        x
    };
    let (q, k) = (unit(t * K), unit(t * K));
    let mut s2 = 99u64;
    let mut r2 = move || {
        s2 = s2
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (s2 >> 40) as f32 / (1u64 << 24) as f32
    };
    Inputs {
        q,
        k,
        v: (0..t * K).map(|_| r2() - 0.5).collect(),
        g: (0..t * K)
            .map(|_| -5.0 / (1.0 + (-(r2() * 8.0 - 6.0)).exp()))
            .collect(),
        beta: (0..t).map(|_| r2()).collect(),
    }
}

impl Inputs {
    /// The kernels' view of the inputs, with values `v` and state `s`.
    fn rows<'a>(&'a self, v: &'a mut [f32], s: &'a mut [f32]) -> HeadRows<'a> {
        HeadRows {
            q: &self.q,
            k: &self.k,
            g: &self.g,
            beta: &self.beta,
            v_o: v,
            state: s,
            scale: 0.088,
        }
    }
}

fn run_recurrent(isa: Isa, x: &Inputs, v: &mut [f32], s: &mut [f32], scr: &mut [f32]) {
    v.copy_from_slice(&x.v);
    recurrent_head(isa, x.rows(v, s), scr).unwrap();
}

fn run_chunked(isa: Isa, c: usize, x: &Inputs, v: &mut [f32], s: &mut [f32], scr: &mut [f32]) {
    v.copy_from_slice(&x.v);
    chunked_head(isa, x.rows(v, s), Chunks::of(c), scr).unwrap();
}

#[path = "common/peak.rs"]
mod peak;
use peak::{bench_isa, fma_peak};

fn bench(c: &mut Criterion) {
    let isa = bench_isa();
    println!(
        "ISA: {} (kernels and the FMA peak below run on it)",
        isa.name()
    );
    let mut g = c.benchmark_group("fma_peak");
    g.throughput(Throughput::Elements(fma_peak(isa, 1).0 as u64 * 100_000));
    g.bench_function("single_core", |b| {
        b.iter(|| black_box(fma_peak(isa, 100_000)))
    });
    g.finish();

    for &t in &[256usize, 1024, 4096] {
        let x = inputs(t);
        let mut v = vec![0.0; t * K];
        let mut s = vec![0.0; K * K];
        let mut g = c.benchmark_group(format!("delta_rule_K128_T{t}"));
        g.throughput(Throughput::Elements((4 * K * K * t) as u64));
        g.sample_size(10);
        let mut scr = vec![0.0; recurrent_scratch_len(K, K)];
        g.bench_function("recurrent", |b| {
            b.iter(|| run_recurrent(isa, &x, &mut v, &mut s, &mut scr))
        });
        for chunk in [16usize, 32, 64] {
            let mut scr = vec![0.0; chunked_scratch_len(chunk, K, K)];
            g.bench_function(format!("chunked_C{chunk}"), |b| {
                b.iter(|| run_chunked(isa, chunk, &x, &mut v, &mut s, &mut scr))
            });
        }
        g.finish();
    }
    chunk_gemms(c, isa);
    summary(isa);
    decode_recurrence(isa);
}

/// The small GEMMs of one chunk at C = 16, K = V = 128 (about 70 % of the chunked form's
/// time): criterion's "elem/s" is FMA/s, comparable with the peak group's.
fn chunk_gemms(c: &mut Criterion, isa: Isa) {
    let mut g = c.benchmark_group("chunk_gemm_C16");
    for (name, (m, n, k)) in [
        ("state_products_32x128x128", (32usize, 128usize, 128usize)),
        ("state_update_16x128x16", (16, 128, 16)),
        ("intra_chunk_a_32x16x128", (32, 16, 128)),
    ] {
        let a = vec![0.01f32; m * k];
        let b = vec![0.02f32; k * n];
        let mut out = vec![0.0f32; m * n];
        g.throughput(Throughput::Elements((m * n * k) as u64));
        g.bench_function(name, |bch| {
            bch.iter(|| {
                gemm_acc(isa, (m, n, k), (&a, k), (&b, n), (black_box(&mut out), n)).unwrap()
            })
        });
    }
    g.finish();
}

/// Plain-timer summary in one place: ratios against the peak and the recurrence.
fn summary(isa: Isa) {
    let time = |f: &mut dyn FnMut()| {
        f();
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t0 = Instant::now();
            f();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        best
    };
    let iters = 2_000_000;
    let peak = fma_peak(isa, iters).0 as f64
        / time(&mut || {
            black_box(fma_peak(isa, iters));
        });
    println!(
        "\nsummary ({isa:?}): single-core f32 FMA peak {:.1} GFMA/s ({:.1} GFLOP/s)",
        peak / 1e9,
        2.0 * peak / 1e9
    );
    for &t in &[4usize, 8, 16, 32, 64, 256, 1024, 4096] {
        let x = inputs(t);
        let work = (4 * K * K * t) as f64;
        let mut v = vec![0.0; t * K];
        let mut s = vec![0.0; K * K];
        let mut scr = vec![0.0; recurrent_scratch_len(K, K)];
        let tr = time(&mut || run_recurrent(isa, &x, &mut v, &mut s, &mut scr));
        print!(
            "T={t:5}: recurrent {:6.2} µs/token ({:4.1}% of peak)",
            1e6 * tr / t as f64,
            100.0 * work / tr / peak
        );
        for chunk in [16usize, 32, 64] {
            let mut scr = vec![0.0; chunked_scratch_len(chunk, K, K)];
            let tc = time(&mut || run_chunked(isa, chunk, &x, &mut v, &mut s, &mut scr));
            print!(
                " | C{chunk} {:5.2} µs/token ({:4.1}%, {:.2}x)",
                1e6 * tc / t as f64,
                100.0 * work / tc / peak,
                tr / tc
            );
        }
        println!();
    }
}

/// Decode recurrence alone at Kimi K3's head count: 96 heads × 128, 8 sequences, so the 50 MB of
/// state is not in cache; one token per (sequence, head), one thread. Reported against a plain
/// 256 MiB read in the same run: the useful traffic is each state read once and written once.
fn decode_recurrence(isa: Isa) {
    let (heads, seqs) = (96usize, 8usize);
    let states = heads * seqs;
    let mut s = vec![0.01f32; states * K * K];
    let x = inputs(1);
    let mut v = vec![0.0f32; K];
    let mut scr = vec![0.0; recurrent_scratch_len(K, K)];
    let mut step = || {
        for st in s.chunks_exact_mut(K * K) {
            v.copy_from_slice(&x.v);
            recurrent_head(isa, x.rows(&mut v, st), &mut scr).unwrap();
        }
    };
    step();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        step();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let big = vec![1.0f32; 64 << 20];
    let mut read = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        // 16 independent lanes so the read, not the add chain, is the limit.
        let lanes = big.chunks_exact(16).fold([0.0f32; 16], |mut acc, c| {
            for (a, v) in acc.iter_mut().zip(c) {
                *a += v;
            }
            acc
        });
        black_box(lanes);
        read = read.min(t0.elapsed().as_secs_f64());
    }
    let read_bw = (big.len() * 4) as f64 / read;
    let bytes = (2 * states * K * K * 4) as f64;
    println!(
        "decode recurrence alone (96 heads x 128, 8 sequences, {:.0} MB of state): {:.2} ms/token, {:.1} GB/s of state read+written = {:.0}% of a {:.1} GB/s read",
        (states * K * K * 4) as f64 / 1e6,
        1e3 * best,
        bytes / best / 1e9,
        100.0 * bytes / best / read_bw,
        read_bw / 1e9
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
