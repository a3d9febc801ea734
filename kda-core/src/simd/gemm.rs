//! The small dense GEMM of the chunked form, `C = start(C) + A·B` ([`CStart`]), in register
//! blocks of rows ([`Simd::GEMM_ROWS`](super::vector::Simd::GEMM_ROWS)) and short reductions:
//! the safe wrappers, their kernels and their tests.

use super::prefetch::RowQueue;
use super::types::CStart;
use super::{bad, dispatch, fits, portable, Path};
use crate::error::KdaError;

/// `C[m×n] += A[m×k] · B[k×n]`, all row-major with leading dimensions `lda`, `ldb`, `ldc`.
///
/// If a slice is too short for the shape (an internal bug), nothing is computed and an
/// [`KdaError::Internal`] error is returned.
// BLAS-style: the shape (m, n, k) and three matrices with their leading dimensions.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn gemm_acc(
    isa: impl Into<Path>,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) -> Result<(), KdaError> {
    gemm(isa, CStart::Keep, (m, n, k), (a, lda), (b, ldb), (c, ldc))
}

/// `C[m×n] = start(C) + A[m×k] · B[k×n]` (see [`CStart`]), all row-major; each operand is
/// given with its leading dimension. Every element is one chain over the reduction in order,
/// whatever the blocking, from its start value (on Zen 4's AVX-512 paths from zero, the start
/// value added last, so that no chain waits for `C`). A slice too short for the shape (an
/// internal bug) is an [`KdaError::Internal`] error, with nothing computed.
#[inline]
pub fn gemm(
    isa: impl Into<Path>,
    start: CStart<'_>,
    (m, n, k): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) -> Result<(), KdaError> {
    gemm_queued(isa, start, (m, n, k), (a, lda), (b, ldb), (c, ldc), None)
}

/// [`gemm`], prefetching the rows of `queue` meanwhile, a few at a time (the vector paths;
/// the portable one leaves them queued).
#[inline]
pub(crate) fn gemm_queued(
    isa: impl Into<Path>,
    start: CStart<'_>,
    (m, n, k): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if !(fits(c.len(), m, ldc, n)
        && (k == 0 || fits(a.len(), m, lda, k) && fits(b.len(), k, ldb, n)))
    {
        return bad("simd::gemm arguments");
    }
    let c_start = match start {
        CStart::Keep => kernels::CInit::Load,
        CStart::Zero => kernels::CInit::Zero,
        CStart::ScaledRows(f) if f.len() >= m => kernels::CInit::LoadScaled(f.as_ptr()),
        CStart::ScaledRows(_) => return bad("simd::gemm row scales"),
    };
    if k == 0 {
        portable::start_c(start, m, n, c, ldc);
        return Ok(());
    }
    let g = kernels::Gemm {
        a: a.as_ptr(),
        lda,
        b: b.as_ptr(),
        ldb,
        c: c.as_mut_ptr(),
        ldc,
        k,
        c_start,
        queue,
    };
    let _ = &g; // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(isa, gemm_acc(m, n, &g), {
        portable::start_c(start, m, n, c, ldc);
        portable::gemm_acc((m, n, k), (a, lda), (b, ldb), (c, ldc))
    });
    Ok(())
}

/// Whether [`gemm`] runs a reduction of `k` steps over `n` columns on `isa` as one pass of
/// small row blocks (see `Simd::split_fma_gemms`): a caller that splits such a product into
/// row groups for the other shapes' sake can then make one call.
pub(crate) fn short_gemm(isa: impl Into<Path>, k: usize, n: usize) -> bool {
    let _ = (k, n); // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(isa, short_gemm(k, n), false)
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use crate::simd::prefetch::RowQueue;
    use crate::simd::vector::Simd;

    /// The operands of `C += A·B` (row-major, leading dimensions in elements).
    #[derive(Clone, Copy)]
    pub(crate) struct Gemm<'q> {
        /// `A` `[m, k]`.
        pub a: *const f32,
        /// Row stride of `A`.
        pub lda: usize,
        /// `B` `[k, n]`.
        pub b: *const f32,
        /// Row stride of `B`.
        pub ldb: usize,
        /// `C` `[m, n]`.
        pub c: *mut f32,
        /// Row stride of `C`.
        pub ldc: usize,
        /// The reduction length.
        pub k: usize,
        /// How each block's accumulators start.
        pub c_start: CInit,
        /// Rows to prefetch meanwhile, paced by the multiply-adds done ([`RowQueue::work`], counted
        /// every [`QUEUE_STEP`] steps of a register block).
        pub queue: Option<&'q RowQueue<'q>>,
    }

    /// Reduction steps of a GEMM register block between two reports of its work to its
    /// [`RowQueue`] (on the 32-register paths).
    const QUEUE_STEP: usize = 32;

    /// How a GEMM block's accumulators start: from `C`, from zero, or from `C`'s rows times
    /// per-row factors (`[m]`, one multiply per element, as a separate pass would do).
    #[derive(Clone, Copy)]
    pub(crate) enum CInit {
        Load,
        Zero,
        LoadScaled(*const f32),
    }

    /// One `MR`-row × `NV` vectors register block of `C = start(C) + A·B` at rows `i`, columns
    /// `j`: each element is one chain over `p` in order, from its start value, or, where
    /// [`Simd::split_fma_gemms`] says so, from zero with the start value added at the end (so no
    /// chain waits for `C` to load and, for [`CInit::LoadScaled`], to scale).
    #[inline(always)]
    unsafe fn gemm_block<S: Simd, const MR: usize, const NV: usize>(
        s: S,
        i: usize,
        j: usize,
        g: &Gemm,
    ) {
        let last = s.split_fma_gemms();
        let mut acc = [[s.splat(0.0); NV]; MR];
        if !last && !matches!(g.c_start, CInit::Zero) {
            for (r, acc) in acc.iter_mut().enumerate() {
                for (v, acc) in acc.iter_mut().enumerate() {
                    *acc = s.load(g.c.add((i + r) * g.ldc + j + v * S::LANES));
                }
            }
        }
        if let (false, CInit::LoadScaled(f)) = (last, g.c_start) {
            for (r, acc) in acc.iter_mut().enumerate() {
                let fr = s.splat(*f.add(i + r));
                for acc in acc.iter_mut() {
                    *acc = s.mul(*acc, fr);
                }
            }
        }
        // The queue's rows go out as the block runs: every `QUEUE_STEP` steps on the 32-register
        // paths; on the others once per block (splitting their loop was measured slower).
        let step = if S::GEMM_ROWS >= 12 { QUEUE_STEP } else { g.k };
        let mut p0 = 0;
        while p0 < g.k {
            let p1 = g.k.min(p0 + step);
            if let Some(q) = g.queue {
                q.work(MR * NV * S::LANES * (p1 - p0));
            }
            gemm_steps(s, &mut acc, (i, j), (p0, p1), g);
            p0 = p1;
        }
        if last {
            block_end(s, &mut acc, (i, j), g);
        }
        for (r, acc) in acc.iter().enumerate() {
            for (v, acc) in acc.iter().enumerate() {
                s.store(g.c.add((i + r) * g.ldc + j + v * S::LANES), *acc);
            }
        }
    }

    /// [`gemm_block`]'s start value of `C` added to its accumulators at the end (none for
    /// [`CInit::Zero`]).
    #[inline(always)]
    unsafe fn block_end<S: Simd, const MR: usize, const NV: usize>(
        s: S,
        acc: &mut [[S::F; NV]; MR],
        (i, j): (usize, usize),
        g: &Gemm,
    ) {
        let c = |r: usize, v: usize| g.c.add((i + r) * g.ldc + j + v * S::LANES);
        match g.c_start {
            CInit::Zero => {}
            CInit::Load => {
                for (r, acc) in acc.iter_mut().enumerate() {
                    for (v, acc) in acc.iter_mut().enumerate() {
                        *acc = s.add(s.load(c(r, v)), *acc);
                    }
                }
            }
            CInit::LoadScaled(f) => {
                for (r, acc) in acc.iter_mut().enumerate() {
                    let fr = s.splat(*f.add(i + r));
                    for (v, acc) in acc.iter_mut().enumerate() {
                        *acc = s.add(s.mul(s.load(c(r, v)), fr), *acc);
                    }
                }
            }
        }
    }

    /// Steps `p0..p1` of [`gemm_block`]'s reduction.
    #[inline(always)]
    unsafe fn gemm_steps<S: Simd, const MR: usize, const NV: usize>(
        s: S,
        acc: &mut [[S::F; NV]; MR],
        (i, j): (usize, usize),
        (p0, p1): (usize, usize),
        g: &Gemm,
    ) {
        for p in p0..p1 {
            let bp = g.b.add(p * g.ldb + j);
            let mut bv = [s.splat(0.0); NV];
            for (v, bv) in bv.iter_mut().enumerate() {
                *bv = s.load(bp.add(v * S::LANES));
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = s.broadcast(g.a.add((i + r) * g.lda + p));
                for v in 0..NV {
                    acc[v] = s.mul_add(av, bv[v], acc[v]);
                }
            }
        }
    }

    /// All `m` rows of one column panel `NV` vectors wide. With [`Simd::GEMM_ROWS`] ≥ 12 (32
    /// registers): `⌈m/12⌉` blocks as even as they go (32 = 11 + 11 + 10, 16 = 8 + 8), each with
    /// enough independent accumulators to hide the FMA latency; the chunked form's state products
    /// (m = 32 at chunk 16) were 12 + 12 + 4 + 4, and their two 4-row blocks (8 accumulators, no
    /// slack over the FMA latency) slowed the whole product (PERFORMANCE.md, 2026-12-04, Zen 5,
    /// 9fdfd96).
    /// Otherwise: blocks of 6, a rest of 1 to 3 rows merged with the last 6-row block and split as
    /// evenly as it goes (7 = 4 + 3, 8 = 4 + 4, 9 = 5 + 4): a block of 2 rows has too few
    /// accumulators. The block shape never changes a result: every element is its own chain over
    /// `p`.
    #[inline(always)]
    unsafe fn gemm_panel<S: Simd, const NV: usize>(s: S, m: usize, j: usize, g: &Gemm) {
        let mut i = 0;
        if S::GEMM_ROWS >= 12 {
            let blocks = m.div_ceil(12);
            for b in 0..blocks {
                // At most 12: `m − i ≤ 12·(blocks − b)`.
                let rows = (m - i).div_ceil(blocks - b);
                gemm_rows_wide::<S, NV>(s, rows, i, j, g);
                i += rows;
            }
            return;
        }
        let rest = (m - i) % 6;
        let sixes = (m - i) / 6;
        let merged = if (1..=3).contains(&rest) && sixes > 0 {
            6 + rest
        } else {
            rest
        };
        while i + merged + 6 <= m {
            gemm_block::<S, 6, NV>(s, i, j, g);
            i += 6;
        }
        if merged > 6 {
            let first = merged - merged / 2;
            gemm_rows::<S, NV>(s, first, i, j, g);
            i += first;
        }
        gemm_rows::<S, NV>(s, m - i, i, j, g);
    }

    /// One block of `rows` (at most 12) rows, for the 32-register paths.
    #[inline(always)]
    unsafe fn gemm_rows_wide<S: Simd, const NV: usize>(
        s: S,
        rows: usize,
        i: usize,
        j: usize,
        g: &Gemm,
    ) {
        match rows {
            12 => gemm_block::<S, 12, NV>(s, i, j, g),
            11 => gemm_block::<S, 11, NV>(s, i, j, g),
            10 => gemm_block::<S, 10, NV>(s, i, j, g),
            9 => gemm_block::<S, 9, NV>(s, i, j, g),
            8 => gemm_block::<S, 8, NV>(s, i, j, g),
            7 => gemm_block::<S, 7, NV>(s, i, j, g),
            _ => gemm_rows::<S, NV>(s, rows, i, j, g),
        }
    }

    /// One block of `rows` (at most 6) rows.
    #[inline(always)]
    unsafe fn gemm_rows<S: Simd, const NV: usize>(s: S, rows: usize, i: usize, j: usize, g: &Gemm) {
        match rows {
            6 => gemm_block::<S, 6, NV>(s, i, j, g),
            5 => gemm_block::<S, 5, NV>(s, i, j, g),
            4 => gemm_block::<S, 4, NV>(s, i, j, g),
            3 => gemm_block::<S, 3, NV>(s, i, j, g),
            2 => gemm_block::<S, 2, NV>(s, i, j, g),
            1 => gemm_block::<S, 1, NV>(s, i, j, g),
            _ => {}
        }
    }

    /// `C[m×n] = start(C) + A[m×k]·B[k×n]`: a short reduction as [`gemm_short`]; otherwise
    /// column panels of [`Simd::GEMM_VECS`] vectors (then fewer) outer, so each panel of `B` stays
    /// in L1 while the row blocks of `A` stream past it; the last `n % LANES` columns one element
    /// at a time (each one chain from its start value). Whatever the blocking, every element is
    /// one chain over `p` in order, joined by its start value first or last (see
    /// [`gemm_block`]).
    #[inline(always)]
    pub(crate) unsafe fn gemm_acc<S: Simd>(s: S, m: usize, n: usize, g: &Gemm) {
        let l = S::LANES;
        if short_gemm(s, g.k, n) {
            return gemm_short(s, m, n, g);
        }
        let mut j = 0;
        if S::GEMM_VECS >= 4 {
            while j + 4 * l <= n {
                gemm_panel::<S, 4>(s, m, j, g);
                j += 4 * l;
            }
        }
        while j + 2 * l <= n {
            gemm_panel::<S, 2>(s, m, j, g);
            j += 2 * l;
        }
        if j + l <= n {
            gemm_panel::<S, 1>(s, m, j, g);
            j += l;
        }
        for jj in j..n {
            for i in 0..m {
                let c = g.c.add(i * g.ldc + jj);
                let mut acc = match g.c_start {
                    CInit::Load => *c,
                    CInit::Zero => 0.0,
                    CInit::LoadScaled(f) => *c * *f.add(i),
                };
                for p in 0..g.k {
                    acc += *g.a.add(i * g.lda + p) * *g.b.add(p * g.ldb + jj);
                }
                *c = acc;
            }
        }
    }

    /// Longest reduction [`gemm_short`] takes (the chunked form's state update at chunk 16).
    const SHORT_K: usize = 16;

    /// Whether [`gemm_acc`] runs a reduction of `k` steps over `n` columns as [`gemm_short`]: on
    /// the paths whose [`Simd::split_fma_gemms`] says so, with 32 registers, for `k ≤`
    /// [`SHORT_K`] and `n` a multiple of four vectors.
    #[inline(always)]
    pub(crate) fn short_gemm<S: Simd>(s: S, k: usize, n: usize) -> bool {
        S::REGISTERS >= 32 && k <= SHORT_K && n.is_multiple_of(4 * S::LANES) && s.split_fma_gemms()
    }

    /// `C[m×n] = start(C) + A·B` for a short reduction (see [`short_gemm`]): blocks of 4 rows × 4
    /// vectors (16 accumulators; four loads of `B` and four broadcasts of `A` per 16
    /// multiply-adds), row blocks outer so that each block's rows of `C` are read once, close
    /// together; the last `m % 4` rows one block.
    #[inline(always)]
    unsafe fn gemm_short<S: Simd>(s: S, m: usize, n: usize, g: &Gemm) {
        let width = 4 * S::LANES;
        let mut i = 0;
        while i < m {
            let rows = (m - i).min(4);
            for j in (0..n).step_by(width) {
                match rows {
                    4 => gemm_block::<S, 4, 4>(s, i, j, g),
                    3 => gemm_block::<S, 3, 4>(s, i, j, g),
                    2 => gemm_block::<S, 2, 4>(s, i, j, g),
                    _ => gemm_block::<S, 1, 4>(s, i, j, g),
                }
            }
            i += rows;
        }
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn gemm_acc(m: usize, n: usize, g: &$crate::simd::gemm::kernels::Gemm) {
                $crate::simd::gemm::kernels::gemm_acc($token, m, n, g)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn short_gemm(k: usize, n: usize) -> bool {
                $crate::simd::gemm::kernels::short_gemm($token, k, n)
            }
        };
    }
    pub(crate) use entry_points;
}

super::instantiate!();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::test_support::{rnd, test_paths};
    use std::vec::Vec;

    /// Every row count from 1 to 40 (the 12-, 6- and merged 4/5-row splits, and the 4-row
    /// blocks of a short reduction): the whole GEMM equals one call per row, bitwise, so each
    /// row is covered once and the blocking changes nothing.
    #[test]
    fn gemm_row_blocks_cover_every_row_bitwise() {
        // Lanes(4) takes the short-reduction blocks on any machine.
        assert!(short_gemm(Path::Lanes(4), 16, 64) && !short_gemm(Path::Lanes(4), 19, 40));
        for isa in test_paths() {
            for (n, k) in [(40, 19), (64, 16)] {
                gemm_rows_bitwise(isa, n, k);
            }
        }
    }

    fn gemm_rows_bitwise(isa: Path, n: usize, k: usize) {
        let b = rnd(k * n, 5);
        for m in 1..=40 {
            let a = rnd(m * k, 6);
            let c0 = rnd(m * n, 7);
            let mut whole = c0.clone();
            assert!(gemm_acc(isa, m, n, k, &a, k, &b, n, &mut whole, n).is_ok());
            let mut by_row = c0.clone();
            for (ar, cr) in a.chunks_exact(k).zip(by_row.chunks_exact_mut(n)) {
                assert!(gemm_acc(isa, 1, n, k, ar, k, &b, n, cr, n).is_ok());
            }
            let same = whole
                .iter()
                .zip(&by_row)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{isa:?} m = {m}");
            assert_ne!(whole, c0, "{isa:?} m = {m}: nothing accumulated");
        }
    }

    /// `Zero` and `ScaledRows` starts equal a separate fill / scaling pass followed by
    /// `gemm_acc`, bitwise, on every path (column tails and an empty reduction included).
    #[test]
    fn gemm_starts_equal_a_separate_pass_bitwise() {
        for isa in test_paths() {
            for &(m, n, k) in &[
                (16usize, 128usize, 16usize),
                (7, 64, 16),
                (7, 37, 5),
                (32, 20, 1),
                (5, 9, 0),
            ] {
                let (lda, ldb, ldc) = (k + 1, n + 2, n + 3);
                let a = rnd(m * lda, 21);
                let b = rnd(k * ldb, 22);
                let c0 = rnd(m * ldc, 23);
                let f = rnd(m, 24);
                for start in [CStart::Zero, CStart::ScaledRows(&f)] {
                    let mut fused = c0.clone();
                    let r = gemm(
                        isa,
                        start,
                        (m, n, k),
                        (&a, lda),
                        (&b, ldb),
                        (&mut fused, ldc),
                    );
                    assert!(r.is_ok());
                    let mut apart = c0.clone();
                    for (i, row) in apart.chunks_exact_mut(ldc).enumerate() {
                        for x in &mut row[..n] {
                            *x = if let CStart::ScaledRows(f) = start {
                                *x * f[i]
                            } else {
                                0.0
                            };
                        }
                    }
                    if k > 0 {
                        let r = gemm_acc(isa, m, n, k, &a, lda, &b, ldb, &mut apart, ldc);
                        assert!(r.is_ok());
                    }
                    let same = fused
                        .iter()
                        .zip(&apart)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{isa:?} {start:?} {m}x{n}x{k}");
                }
                let short = CStart::ScaledRows(&f[..m - 1]);
                let mut c = c0.clone();
                let r = gemm(isa, short, (m, n, k), (&a, lda), (&b, ldb), (&mut c, ldc));
                assert!(r.is_err() && c == c0, "{isa:?}: too few row scales");
            }
        }
    }

    #[test]
    fn gemm_matches_triple_loop() {
        for isa in test_paths() {
            for &(m, n, k) in &[
                (1usize, 1usize, 1usize),
                (4, 16, 8),
                (5, 17, 3),
                (16, 128, 128),
                (7, 33, 70),
                (64, 40, 9),
                (7, 64, 16),
                (9, 128, 5),
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
                assert!(gemm_acc(isa, m, n, k, &a, lda, &b, ldb, &mut c, ldc).is_ok());
                for i in 0..m {
                    for j in 0..ldc {
                        let w = want[i * ldc + j];
                        assert!(
                            (c[i * ldc + j] as f64 - w).abs() < 1e-4,
                            "{isa:?} {m}x{n}x{k} [{i},{j}]"
                        );
                    }
                }
                assert!(
                    gemm_acc(isa, m, n, k, &a[..1], lda, &b, ldb, &mut c, ldc).is_err()
                        || m * k <= 1
                );
            }
        }
    }
}
