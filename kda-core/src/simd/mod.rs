//! The inner loops every kernel is built from, one implementation per instruction set, chosen
//! at run time (RustFFT style).
//!
//! * [`Isa::Portable`]: plain Rust the compiler vectorises for the baseline target; runs
//!   everywhere (Cortex-M included).
//! * [`Isa::Avx2Fma`]: x86-64 AVX2 + FMA intrinsics (`avx2.rs`), used when the CPU has both.
//!   Detection is at run time with the `std` feature, else at compile time
//!   (`-C target-feature=+avx2,+fma`).
//!
//! Every function here gives the same answer, bitwise, for any split of the work across calls
//! or threads; the paths differ from each other only by rounding (FMA vs separate multiply and
//! add; the vector `exp` is within 2 ulp of `libm`). Each fast path is tested against the
//! portable one in this module's tests.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod portable;

use half::bf16;

/// An instruction-set path for the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust (auto-vectorised for the compile target).
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2Fma,
}

impl Isa {
    /// The fastest path this CPU supports.
    pub fn detect() -> Isa {
        if Isa::Avx2Fma.is_supported() {
            Isa::Avx2Fma
        } else {
            Isa::Portable
        }
    }

    /// Whether this CPU can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2Fma => avx2_fma_supported(),
        }
    }

    /// Every path this CPU supports (for tests and benchmarks).
    pub fn all_supported() -> impl Iterator<Item = Isa> {
        [Isa::Portable, Isa::Avx2Fma]
            .into_iter()
            .filter(|i| i.is_supported())
    }
}

#[cfg(all(target_arch = "x86_64", any(feature = "std", test)))]
fn avx2_fma_supported() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

#[cfg(all(target_arch = "x86_64", not(any(feature = "std", test))))]
fn avx2_fma_supported() -> bool {
    cfg!(all(target_feature = "avx2", target_feature = "fma"))
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_fma_supported() -> bool {
    false
}

/// Runs the AVX2 variant when `isa` asks for it (and the CPU has it), else the portable one.
macro_rules! dispatch {
    ($isa:expr, $name:ident ( $($arg:expr),* )) => {{
        #[cfg(target_arch = "x86_64")]
        {
            if $isa == Isa::Avx2Fma && avx2_fma_supported() {
                // SAFETY: the CPU supports AVX2 and FMA (checked just above), which is the only
                // requirement of the `avx2` functions beyond the slice bounds their safe
                // wrappers here have already checked.
                return unsafe { avx2::$name($($arg),*) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = $isa;
        portable::$name($($arg),*)
    }};
}

/// Lane accumulators of a 3 × 4 dot block (`[(t·4 + r)·8 + lane]`), kept between the
/// k-blocks of [`dot_partial_tokens`] calls.
pub type LaneAcc = [f32; 96];

/// Weights of a k-blocked dot block, f32 or bf16 rows.
#[derive(Clone, Copy)]
pub enum Rows<'a, 'b> {
    /// f32 rows.
    F32(&'a [&'b [f32]]),
    /// bf16 rows.
    Bf16(&'a [&'b [bf16]]),
}

/// Dot products of up to 3 tokens × 4 weight rows per group, k-blocked: adds the whole
/// 8-blocks of `[k0, k1)` (`k1 − k0` a multiple of 8) lane-wise to the accumulators, for any
/// number of tokens in groups of 3 (the last may be shorter), group `g` using slot
/// `accs[96·g..96·g + 96]`. Chained over consecutive k-blocks and closed by [`dot_finish`],
/// each (token, row) result is bitwise the same however the reduction is cut and whatever the
/// group shape, so decode (one token) and prefill (many), on any thread, agree exactly.
#[must_use]
pub fn dot_partial_tokens(
    isa: Isa,
    k0: usize,
    k1: usize,
    xs: &[&[f32]],
    ws: Rows<'_, '_>,
    accs: &mut [f32],
) -> bool {
    let groups = xs.len().div_ceil(3);
    let ok = k0 <= k1
        && (k1 - k0) % 8 == 0
        && accs.len() >= 96 * groups
        && xs.iter().all(|x| x.len() >= k1);
    match ws {
        Rows::F32(ws) if ok && (1..=4).contains(&ws.len()) && ws.iter().all(|w| w.len() >= k1) => {
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx2Fma && avx2_fma_supported() {
                // SAFETY: AVX2+FMA present; rows ≥ k1 long and `accs` ≥ 96 per group (checked).
                unsafe { avx2::dot_partial_tokens(k0, k1, xs, ws, accs) };
                return true;
            }
            portable::dot_partial_tokens(k0, k1, xs, ws, accs, |v| v);
            true
        }
        Rows::Bf16(ws) if ok && (1..=4).contains(&ws.len()) && ws.iter().all(|w| w.len() >= k1) => {
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx2Fma && avx2_fma_supported() {
                // SAFETY: as above.
                unsafe { avx2::dot_partial_tokens(k0, k1, xs, ws, accs) };
                return true;
            }
            portable::dot_partial_tokens(k0, k1, xs, ws, accs, portable::bf16_to_f32);
            true
        }
        _ => false,
    }
}

/// Reduces the lane accumulators of one group (1–3 tokens × 1–4 rows) and adds the scalar
/// tail `[k1, n)`. Returns false (leaving `out` untouched) for a bad shape.
#[must_use]
pub fn dot_finish(
    isa: Isa,
    k1: usize,
    n: usize,
    xs: &[&[f32]],
    ws: Rows<'_, '_>,
    acc: &LaneAcc,
    out: &mut [[f32; 4]; 3],
) -> bool {
    if k1 > n {
        return false;
    }
    match ws {
        Rows::F32(ws) if block_ok(n, xs, ws) => {
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx2Fma && avx2_fma_supported() {
                // SAFETY: AVX2+FMA present; 1–3 rows of ≥ n inputs, 1–4 weight rows (checked).
                unsafe { avx2::dot_finish(k1, n, xs, ws, acc, out) };
                return true;
            }
            portable::finish_tile(k1, n, xs, ws, acc, out, |v| v);
            true
        }
        Rows::Bf16(ws) if block_ok(n, xs, ws) => {
            #[cfg(target_arch = "x86_64")]
            if isa == Isa::Avx2Fma && avx2_fma_supported() {
                // SAFETY: as above.
                unsafe { avx2::dot_finish(k1, n, xs, ws, acc, out) };
                return true;
            }
            portable::finish_tile(k1, n, xs, ws, acc, out, portable::bf16_to_f32);
            true
        }
        _ => false,
    }
}

fn block_ok<W>(n: usize, xs: &[&[f32]], ws: &[&[W]]) -> bool {
    (1..=3).contains(&xs.len())
        && (1..=4).contains(&ws.len())
        && xs.iter().all(|x| x.len() >= n)
        && ws.iter().all(|w| w.len() >= n)
}

/// `y[i] += a·x[i]`.
#[inline]
pub fn axpy(isa: Isa, a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    dispatch!(isa, axpy(a, x, y))
}

/// Recurrence pass 1 for one key row: `s[i] *= decay; p[i] += k·s[i]`.
#[inline]
pub fn decay_predict(isa: Isa, s: &mut [f32], decay: f32, k: f32, p: &mut [f32]) {
    let n = s.len().min(p.len());
    let (s, p) = (&mut s[..n], &mut p[..n]);
    dispatch!(isa, decay_predict(s, decay, k, p))
}

/// Recurrence pass 2 for one key row: `s[i] += k·delta[i]; o[i] += q·s[i]`.
#[inline]
pub fn write_read(isa: Isa, s: &mut [f32], k: f32, delta: &[f32], q: f32, o: &mut [f32]) {
    let n = s.len().min(delta.len()).min(o.len());
    let (s, delta, o) = (&mut s[..n], &delta[..n], &mut o[..n]);
    dispatch!(isa, write_read(s, k, delta, q, o))
}

/// `x[i] = e^{x[i]}` (vector path: Cephes polynomial, < 2 ulp; flushes below e^−87.5 to 0).
#[inline]
pub fn exp_in_place(isa: Isa, x: &mut [f32]) {
    dispatch!(isa, exp_in_place(x))
}

/// `C[m×n] += A[m×k] · B[k×n]`, all row-major with leading dimensions `lda`, `ldb`, `ldc`.
///
/// If a slice is too short for the shape (an internal bug), nothing is computed and `false`
/// is returned.
#[allow(clippy::too_many_arguments)]
#[inline]
#[must_use]
pub fn gemm_acc(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) -> bool {
    if m == 0 || n == 0 || k == 0 {
        return true;
    }
    let fits = |len: usize, rows: usize, ld: usize, cols: usize| {
        ld >= cols
            && (rows - 1)
                .checked_mul(ld)
                .and_then(|v| v.checked_add(cols))
                .is_some_and(|need| need <= len)
    };
    if !(fits(a.len(), m, lda, k) && fits(b.len(), k, ldb, n) && fits(c.len(), m, ldc, n)) {
        return false;
    }
    (|| dispatch!(isa, gemm_acc(m, n, k, a, lda, b, ldb, c, ldc)))();
    true
}

/// `dst[c·ldd + r] = src[r·lds + c]` for an `rows × cols` block (out-of-place transpose).
/// Returns false (doing nothing) if a slice is too short.
#[must_use]
pub fn transpose(
    isa: Isa,
    rows: usize,
    cols: usize,
    src: &[f32],
    lds: usize,
    dst: &mut [f32],
    ldd: usize,
) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    let fits = |len: usize, r: usize, ld: usize, c: usize| {
        ld >= c
            && (r - 1)
                .checked_mul(ld)
                .and_then(|v| v.checked_add(c))
                .is_some_and(|need| need <= len)
    };
    if !(fits(src.len(), rows, lds, cols) && fits(dst.len(), cols, ldd, rows)) {
        return false;
    }
    (|| dispatch!(isa, transpose(rows, cols, src, lds, dst, ldd)))();
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn rnd(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    #[test]
    fn every_path_matches_portable() {
        std::println!(
            "paths on this CPU: {:?}",
            Isa::all_supported().collect::<Vec<_>>()
        );
        for isa in Isa::all_supported() {
            for n in [0usize, 1, 7, 8, 15, 16, 17, 31, 33, 100, 128, 257] {
                let x = rnd(n, 1);
                let mut y1 = rnd(n, 7);
                let mut y2 = y1.clone();
                axpy(isa, 0.3, &x, &mut y1);
                portable::axpy(0.3, &x, &mut y2);
                assert!(y1.iter().zip(&y2).all(|(a, b)| close(*a, *b, 1e-6)));
                let (mut s1, mut p1) = (rnd(n, 8), rnd(n, 9));
                let (mut s2, mut p2) = (s1.clone(), p1.clone());
                decay_predict(isa, &mut s1, 0.9, -0.7, &mut p1);
                portable::decay_predict(&mut s2, 0.9, -0.7, &mut p2);
                assert!(s1.iter().zip(&s2).all(|(a, b)| close(*a, *b, 1e-6)));
                assert!(p1.iter().zip(&p2).all(|(a, b)| close(*a, *b, 1e-6)));
                write_read(isa, &mut s1, 0.4, &x, 1.3, &mut p1);
                portable::write_read(&mut s2, 0.4, &x, 1.3, &mut p2);
                assert!(s1.iter().zip(&s2).all(|(a, b)| close(*a, *b, 1e-6)));
                assert!(p1.iter().zip(&p2).all(|(a, b)| close(*a, *b, 1e-6)));
            }
        }
    }

    /// One group through `dot_partial_tokens` in k-blocks of `kstep` (0: one block), then
    /// `dot_finish`.
    fn block(isa: Isa, n: usize, xs: &[&[f32]], ws: Rows<'_, '_>, kstep: usize) -> [[f32; 4]; 3] {
        let kfull = n / 8 * 8;
        let step = if kstep == 0 { kfull.max(8) } else { kstep };
        let mut acc = [0.0f32; 96];
        let mut k0 = 0;
        while k0 < kfull {
            let k1 = (k0 + step).min(kfull);
            assert!(dot_partial_tokens(isa, k0, k1, xs, ws, &mut acc));
            k0 = k1;
        }
        let mut out = [[0.0; 4]; 3];
        assert!(dot_finish(isa, kfull, n, xs, ws, &acc, &mut out));
        out
    }

    #[test]
    fn dot_blocks_are_shape_independent_and_match_f64() {
        for isa in Isa::all_supported() {
            for n in [1usize, 7, 8, 9, 64, 100, 2304] {
                let x: Vec<Vec<f32>> = (0..3).map(|t| rnd(n, 30 + t)).collect();
                let w: Vec<Vec<f32>> = (0..4).map(|r| rnd(n, 40 + r)).collect();
                let wb: Vec<Vec<bf16>> = w
                    .iter()
                    .map(|r| r.iter().map(|&v| bf16::from_f32(v)).collect())
                    .collect();
                let xs: Vec<&[f32]> = x.iter().map(|v| &v[..]).collect();
                let ws: Vec<&[f32]> = w.iter().map(|v| &v[..]).collect();
                let wbs: Vec<&[bf16]> = wb.iter().map(|v| &v[..]).collect();
                let full = block(isa, n, &xs, Rows::F32(&ws), 0);
                let fullb = block(isa, n, &xs, Rows::Bf16(&wbs), 0);
                for t in 0..3 {
                    for r in 0..4 {
                        let want: f64 = (0..n).map(|i| x[t][i] as f64 * w[r][i] as f64).sum();
                        assert!((full[t][r] as f64 - want).abs() < 1e-4 * (1.0 + want.abs()));
                        // Any block shape and any k-blocking give bitwise the same value.
                        for (mt, mr, kstep) in
                            [(1usize, 1usize, 16usize), (2, 3, 8), (3, 1, 0), (1, 4, 24)]
                        {
                            let t0 = t.min(3 - mt);
                            let r0 = r.min(4 - mr);
                            let (xg, wg, wgb) =
                                (&xs[t0..t0 + mt], &ws[r0..r0 + mr], &wbs[r0..r0 + mr]);
                            let o = block(isa, n, xg, Rows::F32(wg), kstep);
                            let ob = block(isa, n, xg, Rows::Bf16(wgb), kstep);
                            assert_eq!(o[t - t0][r - r0].to_bits(), full[t][r].to_bits());
                            assert_eq!(ob[t - t0][r - r0].to_bits(), fullb[t][r].to_bits());
                        }
                    }
                }
                let mut o = [[0.0; 4]; 3];
                let acc = [0.0f32; 96];
                assert!(!dot_finish(
                    isa,
                    0,
                    n + 1,
                    &xs,
                    Rows::F32(&ws),
                    &acc,
                    &mut o
                ));
                assert!(!dot_finish(isa, 0, n, &[], Rows::F32(&ws), &acc, &mut o));
                let mut accs = [0.0f32; 96];
                assert!(!dot_partial_tokens(
                    isa,
                    0,
                    4,
                    &xs,
                    Rows::F32(&ws),
                    &mut accs
                ));
            }
        }
    }

    #[test]
    fn exp_paths_agree_and_handle_extremes() {
        let mut xs: Vec<f32> = (0..2000).map(|i| -100.0 + i as f32 * 0.0937).collect();
        xs.extend([
            0.0,
            -0.0,
            -87.0,
            -87.6,
            -1000.0,
            80.0,
            88.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        for isa in Isa::all_supported() {
            let mut y = xs.clone();
            exp_in_place(isa, &mut y);
            for (&x, &v) in xs.iter().zip(&y) {
                let want = libm::expf(x);
                if x.is_nan() {
                    assert!(v.is_nan());
                } else if x < -87.5 {
                    assert!(v == 0.0 || (v - want).abs() < 1e-37, "{x}: {v}");
                } else {
                    assert!(
                        (v - want).abs() <= 2.5e-7 * want,
                        "{isa:?} exp({x}) = {v}, libm {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn transpose_every_shape() {
        for isa in Isa::all_supported() {
            for &(r, c) in &[
                (1usize, 1usize),
                (8, 8),
                (9, 17),
                (16, 128),
                (64, 3),
                (3, 64),
            ] {
                let src = rnd(r * (c + 1), 21);
                let mut dst = std::vec![0.0; c * (r + 2)];
                assert!(transpose(isa, r, c, &src, c + 1, &mut dst, r + 2));
                for i in 0..r {
                    for j in 0..c {
                        assert_eq!(dst[j * (r + 2) + i], src[i * (c + 1) + j]);
                    }
                }
            }
        }
    }

    #[test]
    fn gemm_matches_triple_loop() {
        for isa in Isa::all_supported() {
            for &(m, n, k) in &[
                (1usize, 1usize, 1usize),
                (4, 16, 8),
                (5, 17, 3),
                (16, 128, 128),
                (7, 33, 70),
                (64, 40, 9),
            ] {
                let (lda, ldb, ldc) = (k + 2, n + 1, n + 3);
                let a = rnd(m * lda, 11);
                let b = rnd(k * ldb, 12);
                let mut c = rnd(m * ldc, 13);
                let mut want: Vec<f64> = c.iter().map(|&v| v as f64).collect();
                for i in 0..m {
                    for j in 0..n {
                        for p in 0..k {
                            want[i * ldc + j] += a[i * lda + p] as f64 * b[p * ldb + j] as f64;
                        }
                    }
                }
                assert!(gemm_acc(isa, m, n, k, &a, lda, &b, ldb, &mut c, ldc));
                for i in 0..m {
                    for j in 0..ldc {
                        let w = want[i * ldc + j];
                        assert!(
                            (c[i * ldc + j] as f64 - w).abs() < 1e-4,
                            "{isa:?} {m}x{n}x{k} [{i},{j}]"
                        );
                    }
                }
                assert!(!gemm_acc(isa, m, n, k, &a[..1], lda, &b, ldb, &mut c, ldc) || m * k <= 1);
            }
        }
    }
}
