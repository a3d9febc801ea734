//! The projections as GEMM at Kimi Linear's layer shape: x `[M = 1024, 2304]` times
//! `q_proj` `[4096, 2304]`ᵀ, f32 and bf16 weights, one thread, blocks of 256 tokens as the
//! layer runs them. Throughput in FMAs/s, next to the FMA peak measured in the same run.
//! `KDA_BENCH_ISA=avx2` (any name `Isa::name` prints) benches that path instead of the fastest.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kda_core::internals::{
    project_scratch_len, project_tile, project_tile_pairs, round_pairs_row, Tile, TileRows,
    DECODE_LD, PROJECT_SCRATCH,
};
use kda_core::{bf16, Data, Isa, MatRef};

#[path = "common/peak.rs"]
mod peak;
use peak::{bench_isa, fma_peak};

const M: usize = 1024;
const N_IN: usize = 2304;
const N_OUT: usize = 4096;
const BLOCK: usize = 256;

fn run(isa: Isa, x: &[f32], w: &MatRef<'_>, out: &mut [f32], scratch_len: usize) {
    for b in (0..M).step_by(BLOCK) {
        let row = |t: usize| &x[(b + t) * N_IN..(b + t + 1) * N_IN];
        let blk = &mut out[b * N_OUT..(b + BLOCK) * N_OUT];
        let mut scratch = vec![0.0f32; scratch_len];
        // Tiles of 64 rows, as the layer hands them to its workers in prefill.
        for o0 in (0..N_OUT).step_by(64) {
            let x = TileRows {
                row: &row,
                tokens: BLOCK,
            };
            let tile = Tile { w, o0, o1: o0 + 64 };
            project_tile(isa, x, tile, &mut scratch, &mut |t, o, v| {
                blk[t * N_OUT + o..t * N_OUT + o + v.len()].copy_from_slice(v);
                Ok(())
            })
            .unwrap();
        }
    }
}

/// [`run`] in the bf16 mode: token rows of bf16 pairs, 64-row tiles.
fn run_pairs(isa: Isa, pairs: &[u32], w: &MatRef<'_>, out: &mut [f32], scratch_len: usize) {
    let w2 = N_IN / 2;
    for b in (0..M).step_by(BLOCK) {
        let row = |t: usize| &pairs[(b + t) * w2..(b + t + 1) * w2];
        let blk = &mut out[b * N_OUT..(b + BLOCK) * N_OUT];
        let mut scratch = vec![0.0f32; scratch_len];
        for o0 in (0..N_OUT).step_by(64) {
            let x = TileRows {
                row: &row,
                tokens: BLOCK,
            };
            let tile = Tile { w, o0, o1: o0 + 64 };
            project_tile_pairs(isa, x, tile, &mut scratch, &mut |t, o, v| {
                blk[t * N_OUT + o..t * N_OUT + o + v.len()].copy_from_slice(v);
                Ok(())
            })
            .unwrap();
        }
    }
}

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
    let x: Vec<f32> = (0..M * N_IN)
        .map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5)
        .collect();
    let wf: Vec<f32> = (0..N_OUT * N_IN)
        .map(|i| ((i * 104729) % 997) as f32 / 997.0 - 0.5)
        .collect();
    let wb: Vec<bf16> = wf.iter().map(|&v| bf16::from_f32(v)).collect();
    let mut out = vec![0.0f32; M * N_OUT];
    let mut g = c.benchmark_group("projection_1024x2304x4096");
    g.throughput(Throughput::Elements((M * N_IN * N_OUT) as u64));
    g.sample_size(10);
    let mf = MatRef::new("w", Data::F32(&wf), N_OUT, N_IN).unwrap();
    let mb = MatRef::new("w", Data::Bf16(&wb), N_OUT, N_IN).unwrap();
    // Whole rows packed once per tile (what the layer's prefill workspace allows), and
    // k-blocks of 256 packed in turn (the smaller fixed scratch).
    let whole = project_scratch_len(N_IN, BLOCK);
    for (name, m) in [("f32_weights", &mf), ("bf16_weights", &mb)] {
        g.bench_function(name, |b| b.iter(|| run(isa, &x, m, &mut out, whole)));
        g.bench_function(format!("{name}_kblocked"), |b| {
            b.iter(|| run(isa, &x, m, &mut out, PROJECT_SCRATCH))
        });
    }
    let mut pk = vec![bf16::ZERO; kda_core::panels_len(N_OUT, N_IN).unwrap()];
    kda_core::pack_panels(&mb, &mut pk).unwrap();
    let mp = MatRef::new_panels("w", Data::Bf16(&pk), N_OUT, N_IN).unwrap();
    g.bench_function("bf16_weights_panels", |b| {
        b.iter(|| run(isa, &x, &mp, &mut out, whole))
    });
    // The bf16 precision mode: inputs rounded to bf16 pairs once, `vdpbf16ps` where the CPU
    // has avx512_bf16 (two multiply-adds per instruction and lane: its peak is twice the FMA
    // peak above), 64-row tiles as the layer's.
    let mut pairs = vec![0u32; M * N_IN / 2];
    for (r, p) in x.chunks_exact(N_IN).zip(pairs.chunks_exact_mut(N_IN / 2)) {
        round_pairs_row(isa, r, p).unwrap();
    }
    g.bench_function("bf16_mode_panels", |b| {
        b.iter(|| run_pairs(isa, &pairs, &mp, &mut out, whole))
    });
    g.finish();
    black_box(&out);
    decode(c, isa);
}

/// One decode token through a Kimi K3-sized projection (12288 × 7168 bf16, 176 MB, far beyond
/// cache), row-major and in the panel layout, in tiles as the layer runs them, next to a plain
/// read of the same bytes.
fn decode(c: &mut Criterion, isa: Isa) {
    const ROWS: usize = 12288;
    const COLS: usize = 7168;
    let wb: Vec<bf16> = (0..ROWS * COLS)
        .map(|i| bf16::from_f32(((i * 104729) % 997) as f32 / 997.0 - 0.5))
        .collect();
    let x: Vec<f32> = (0..COLS).map(|i| (i % 13) as f32 / 13.0 - 0.5).collect();
    let m = MatRef::new("w", Data::Bf16(&wb), ROWS, COLS).unwrap();
    let mut out = vec![0.0f32; ROWS];
    let mut g = c.benchmark_group("decode_12288x7168_bf16");
    g.throughput(Throughput::Bytes((ROWS * COLS * 2) as u64));
    g.sample_size(10);
    g.bench_function("plain_read", |b| {
        b.iter(|| black_box(wb.iter().fold(0u16, |a, v| a ^ v.to_bits())))
    });
    // The same bytes as eight interleaved streams (1 KB pieces of eight far-apart regions),
    // the access pattern of the kernels: faster than one stream on this machine.
    g.bench_function("read_8_streams", |b| {
        b.iter(|| {
            let q = wb.len() / 8 / 512 * 512;
            let mut acc = 0u16;
            for off in (0..q).step_by(512) {
                for j in 0..8 {
                    acc ^= wb[j * q + off..j * q + off + 512]
                        .iter()
                        .fold(0u16, |a, v| a ^ v.to_bits());
                }
            }
            black_box(acc)
        })
    });
    let mut pk = vec![bf16::ZERO; kda_core::panels_len(ROWS, COLS).unwrap()];
    kda_core::pack_panels(&m, &mut pk).unwrap();
    let mp = MatRef::new_panels("w", Data::Bf16(&pk), ROWS, COLS).unwrap();
    // The panel kernel's access pattern (eight panels at a time, 16 steps = 512 bytes of each
    // in turn) with no arithmetic: the read limit for that pattern.
    g.bench_function("read_panel_pattern", |b| {
        b.iter(|| black_box(read_panels(&pk, COLS)))
    });
    g.bench_function("project_1_token_panels", |b| {
        b.iter(|| decode_token(isa, &x, &mp, &mut out))
    });
    g.bench_function("project_1_token", |b| {
        b.iter(|| decode_token(isa, &x, &m, &mut out))
    });
    g.finish();
    black_box(&out);
}

criterion_group!(benches, bench);
criterion_main!(benches);

/// One token `x` through `m` in tiles of `DECODE_LD` rows, as the layer's decode runs them.
fn decode_token(isa: Isa, x: &[f32], m: &MatRef<'_>, out: &mut [f32]) {
    let row = |_: usize| x;
    let mut scratch = [0.0f32; 384];
    for o0 in (0..m.rows()).step_by(DECODE_LD) {
        let x = TileRows {
            row: &row,
            tokens: 1,
        };
        let tile = Tile {
            w: m,
            o0,
            o1: (o0 + DECODE_LD).min(m.rows()),
        };
        project_tile(isa, x, tile, &mut scratch, &mut |_, o, v| {
            out[o..o + v.len()].copy_from_slice(v);
            Ok(())
        })
        .unwrap();
    }
}

/// XOR of every 32-byte unit of the panel-layout matrix `pk`, eight panels at a time, 16 steps
/// of each in turn: the order the decode kernel reads them.
fn read_panels(pk: &[bf16], cols: usize) -> u64 {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = cols; // only the AVX2 reader walks the panels
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked above).
        return unsafe { read_panels_avx2(pk, cols) };
    }
    let words: Vec<u64> = pk.iter().map(|v| v.to_bits() as u64).collect();
    words.iter().fold(0, |a, v| a ^ v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_panels_avx2(pk: &[bf16], cols: usize) -> u64 {
    use std::arch::x86_64::*;
    let panel = 16 * cols;
    let mut acc = [_mm256_setzero_si256(); 4];
    for group in pk.chunks(8 * panel) {
        let np = group.len() / panel;
        let base = group.as_ptr();
        for k0 in (0..cols).step_by(16) {
            for p in 0..np {
                for k in k0..(k0 + 16).min(cols) {
                    let v = _mm256_loadu_si256(base.add(p * panel + 16 * k) as *const __m256i);
                    acc[k % 4] = _mm256_xor_si256(acc[k % 4], v);
                }
            }
        }
    }
    let mut out = [0u64; 4];
    let x = _mm256_xor_si256(
        _mm256_xor_si256(acc[0], acc[1]),
        _mm256_xor_si256(acc[2], acc[3]),
    );
    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, x);
    out.iter().fold(0, |a, v| a ^ v)
}
