//! The chunked form's row passes: a tame chunk's row factors in one pass ([`tame_rows`]) and
//! the transposes (one with its rows scaled on the way): the safe wrappers, their kernels and
//! their tests.

use super::types::{TameIn, TameOut};
use super::{bad, dispatch, fits, portable, Path};
use crate::error::KdaError;

/// A tame chunk's row factors in one pass: `b_r` is the TwoSum-compensated running sum of `g`
/// over the rows (`b_0 = g_0`), and each output is as its field says, every product rounded
/// once in the order written there. Returns `Ok(false)` if some `|b_r − b_0|` exceeds `limit`
/// or is NaN (the outputs are then partly written). The vector paths give the reference's bits
/// but for their `exp`. A slice too short for the shape (a bug) is an
/// [`KdaError::Internal`] error, with nothing computed.
pub fn tame_rows(
    isa: impl Into<Path>,
    i: &TameIn<'_>,
    o: &mut TameOut<'_>,
) -> Result<bool, KdaError> {
    let (l, kd) = (i.rows, i.dim);
    let area = l.checked_mul(kd);
    let rows_fit = |(x, ld): (&[f32], usize)| fits(x.len(), l, ld, kd);
    let ok = l > 0
        && kd > 0
        && rows_fit(i.q)
        && rows_fit(i.k)
        && rows_fit(i.g)
        && [&o.qf, &o.kf, &o.kb, &o.qd, &o.kd]
            .iter()
            .all(|x| area.is_some_and(|a| x.len() >= a))
        && [&o.first, &o.last, &o.hi, &o.lo]
            .iter()
            .all(|x| x.len() >= kd);
    if !ok {
        return Err(KdaError::Internal {
            what: "simd::tame_rows arguments",
        });
    }
    let src = |(x, stride): (&[f32], usize)| kernels::Src {
        p: x.as_ptr(),
        stride,
    };
    let t = kernels::Tame {
        q: src(i.q),
        k: src(i.k),
        g: src(i.g),
        rows: l,
        dim: kd,
        scale: i.scale,
        limit: i.limit,
        qf: o.qf.as_mut_ptr(),
        kf: o.kf.as_mut_ptr(),
        kb: o.kb.as_mut_ptr(),
        qd: o.qd.as_mut_ptr(),
        kd: o.kd.as_mut_ptr(),
        first: o.first.as_mut_ptr(),
        last: o.last.as_mut_ptr(),
        hi: o.hi.as_mut_ptr(),
        lo: o.lo.as_mut_ptr(),
    };
    let _ = &t; // read only by the vector arms (none on targets without a vector ISA)
    Ok(dispatch!(isa, tame_rows(&t), portable::tame_rows(i, o)))
}

/// `dst[c·ldd + r] = src[r·lds + c]` for an `rows × cols` block (out-of-place transpose).
/// A slice too short for the shape (a bug) is an [`KdaError::Internal`] error, with nothing
/// done.
pub fn transpose(
    isa: impl Into<Path>,
    rows: usize,
    cols: usize,
    src: &[f32],
    lds: usize,
    dst: &mut [f32],
    ldd: usize,
) -> Result<(), KdaError> {
    transpose_with(isa.into(), (rows, cols), (src, lds), (dst, ldd), None)
}

/// [`transpose`], and in the same pass `scaled[c·ldd + r] = scales[c] · src[r·lds + c]`: the
/// transpose with each of its rows scaled, as a second output (bitwise the products that a
/// pass of its own over the transpose would make).
pub(crate) fn transpose_scaled(
    isa: impl Into<Path>,
    shape: (usize, usize),
    src: (&[f32], usize),
    dst: (&mut [f32], usize),
    scaled: (&mut [f32], &[f32]),
) -> Result<(), KdaError> {
    transpose_with(isa.into(), shape, src, dst, Some(scaled))
}

/// [`transpose`] and [`transpose_scaled`]: every slice checked against the shape first.
fn transpose_with(
    isa: Path,
    (rows, cols): (usize, usize),
    (src, lds): (&[f32], usize),
    (dst, ldd): (&mut [f32], usize),
    scaled: Option<(&mut [f32], &[f32])>,
) -> Result<(), KdaError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let second_fits = scaled
        .as_ref()
        .is_none_or(|(d, f)| fits(d.len(), cols, ldd, rows) && f.len() >= cols);
    if !(fits(src.len(), rows, lds, cols) && fits(dst.len(), cols, ldd, rows) && second_fits) {
        return bad("simd::transpose arguments");
    }
    dispatch!(
        isa,
        transpose((rows, cols), (src, lds), (dst, ldd), scaled),
        portable::transpose((rows, cols), (src, lds), (dst, ldd), scaled)
    );
    Ok(())
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use crate::simd::elementwise::kernels::EXP_GROUP;
    use crate::simd::prefetch::line_starts;
    use crate::simd::vector::{load_upto, store_upto, Simd, MAX_LANES};

    /// Rows of `dim` f32 `stride` apart, read by [`tame_rows`].
    #[derive(Clone, Copy)]
    pub(crate) struct Src {
        pub p: *const f32,
        pub stride: usize,
    }

    /// The arguments of [`tame_rows`] (see [`super::tame_rows`]): inputs `q`, `k`, `g` of `rows`
    /// rows of `dim`; outputs `[rows, dim]` row-major (`qf` … `kd`) and `[dim]` (`first`, `last`).
    pub(crate) struct Tame {
        pub q: Src,
        pub k: Src,
        pub g: Src,
        pub rows: usize,
        pub dim: usize,
        pub scale: f32,
        pub limit: f32,
        pub qf: *mut f32,
        pub kf: *mut f32,
        pub kb: *mut f32,
        pub qd: *mut f32,
        pub kd: *mut f32,
        pub first: *mut f32,
        pub last: *mut f32,
        pub hi: *mut f32,
        pub lo: *mut f32,
    }

    /// Rows ahead whose inputs [`tame_rows`] prefetches (into L1: the hardware prefetchers do not
    /// follow rows a page or more apart).
    const AHEAD: usize = 2;

    /// A tame chunk's row factors in one pass over its inputs, row by row (the running sums of
    /// the row before in `hi`, `lo`). Returns whether every `|b_r − b_0|` is at most `limit` (a
    /// NaN fails); if not, the outputs are partly written.
    #[inline(always)]
    pub(crate) unsafe fn tame_rows<S: Simd>(s: S, t: &Tame) -> bool {
        let mut spill = s.splat(0.0);
        for r in 0..t.rows {
            if r + AHEAD < t.rows {
                for src in [t.q, t.k, t.g] {
                    // Every line the row touches (a numpy row, 16 bytes into a line, one more).
                    let row = src.p.add((r + AHEAD) * src.stride) as usize;
                    for line in line_starts(row, 4 * t.dim) {
                        s.prefetch(line as *const f32);
                    }
                }
            }
            spill = if r == 0 {
                tame_row::<S, true>(s, t, r, spill)
            } else {
                tame_row::<S, false>(s, t, r, spill)
            };
        }
        // A sum of squares: 0 only if every term is.
        s.reduce_sum(spill) == 0.0
    }

    /// Row `r` of [`tame_rows`] (`FIRST`: `r == 0`, its own instantiation): groups of
    /// [`EXP_GROUP`] whole vectors (no branch per load or store), then one vector at a time.
    #[inline(always)]
    unsafe fn tame_row<S: Simd, const FIRST: bool>(s: S, t: &Tame, r: usize, spill: S::F) -> S::F {
        let (mut spill, mut d, l) = (spill, 0, S::LANES);
        while d + EXP_GROUP * l <= t.dim {
            spill = tame_vectors::<S, FIRST, EXP_GROUP>(s, t, (r, d, l), spill);
            d += EXP_GROUP * l;
        }
        while d < t.dim {
            let n = (t.dim - d).min(l);
            spill = tame_vectors::<S, FIRST, 1>(s, t, (r, d, n), spill);
            d += n;
        }
        spill
    }

    /// `W` vectors of row `r` of [`tame_rows`] from column `d` (the last one `n` lanes, the others
    /// whole): the same operations, in the same order, as the reference's (`portable::tame_rows`),
    /// with the path's `exp`. Each vector's steps are its own; only their order in the code is
    /// interleaved (the exponents in lockstep), so that the vectors' long dependency chains
    /// overlap. Returns `spill` plus the squares of how far each `b_r − b_0` lies outside
    /// `±limit` (0 within; NaN stays NaN).
    #[inline(always)]
    unsafe fn tame_vectors<S: Simd, const FIRST: bool, const W: usize>(
        s: S,
        t: &Tame,
        (r, d, n): (usize, usize, usize),
        spill: S::F,
    ) -> S::F {
        let l = S::LANES;
        let lanes = |i: usize| if i + 1 == W { n } else { l };
        let (mut diff, mut first) = ([s.splat(0.0); W], [s.splat(0.0); W]);
        let mut spill = spill;
        for i in 0..W {
            let (di, fi, out) = tame_diff::<S, FIRST>(s, t, (r, d + i * l, lanes(i)));
            (diff[i], first[i]) = (di, fi);
            spill = s.mul_add(out, out, spill);
        }
        if FIRST {
            first = s.exp_n(first);
            for (i, &f) in first.iter().enumerate() {
                store_upto(s, t.first.add(d + i * l), lanes(i), f);
            }
        }
        let f = s.exp_n(diff);
        for i in 0..W {
            tame_outputs(s, t, (r, d + i * l, lanes(i)), f[i], first[i]);
        }
        spill
    }

    /// Step 1 of [`tame_vectors`] for columns `d..d + n`: stores the running sums `b_r` and
    /// returns `b_r − b_0`, `e^{b_0}` (in row 0 `g_0` itself, for the caller to exponentiate) and
    /// how far `b_r − b_0` lies outside `±limit`.
    #[inline(always)]
    unsafe fn tame_diff<S: Simd, const FIRST: bool>(
        s: S,
        t: &Tame,
        (r, d, n): (usize, usize, usize),
    ) -> (S::F, S::F, S::F) {
        let g0 = load_upto(s, t.g.p.add(d), n);
        let (hi, lo, first) = if FIRST {
            (g0, s.splat(0.0), g0)
        } else {
            // TwoSum: `hi + lo` is the compensated running sum.
            let x = load_upto(s, t.g.p.add(r * t.g.stride + d), n);
            let (hi, lo) = (load_upto(s, t.hi.add(d), n), load_upto(s, t.lo.add(d), n));
            let sum = s.add(hi, x);
            let bp = s.sub(sum, hi);
            let err = s.add(s.sub(hi, s.sub(sum, bp)), s.sub(x, bp));
            (sum, s.add(lo, err), load_upto(s, t.first.add(d), n))
        };
        store_upto(s, t.hi.add(d), n, hi);
        store_upto(s, t.lo.add(d), n, lo);
        // b_r − b_0 (b_0's low part is 0).
        let diff = s.add(s.sub(hi, g0), lo);
        (diff, first, s.sub(diff, s.clamp(diff, -t.limit, t.limit)))
    }

    /// Step 2 of [`tame_vectors`] for columns `d..d + n`, given `f = e^{b_r − b_0}` and
    /// `first = e^{b_0}`: the five factor rows (and the last row's `f`).
    #[inline(always)]
    unsafe fn tame_outputs<S: Simd>(
        s: S,
        t: &Tame,
        (r, d, n): (usize, usize, usize),
        f: S::F,
        first: S::F,
    ) {
        if r + 1 == t.rows {
            store_upto(s, t.last.add(d), n, f);
        }
        let q = load_upto(s, t.q.p.add(r * t.q.stride + d), n);
        let k = load_upto(s, t.k.p.add(r * t.k.stride + d), n);
        let (qf, kf) = (s.mul(q, f), s.mul(k, f));
        let at = r * t.dim + d;
        store_upto(s, t.qf.add(at), n, qf);
        store_upto(s, t.kf.add(at), n, kf);
        store_upto(s, t.kb.add(at), n, s.mul(k, s.div(s.splat(1.0), f)));
        store_upto(
            s,
            t.qd.add(at),
            n,
            s.mul(s.mul(s.splat(t.scale), first), qf),
        );
        store_upto(s, t.kd.add(at), n, s.mul(first, kf));
    }

    /// `dst[c·ldd + r] = src[r·lds + c]` for a `rows × cols` block and, given `(scaled, scales)`,
    /// also `scaled[c·ldd + r] = scales[c] · src[r·lds + c]`: `LANES × LANES` tiles through
    /// registers, scalar edges.
    #[inline(always)]
    pub(crate) unsafe fn transpose<S: Simd>(
        s: S,
        (rows, cols): (usize, usize),
        (src, lds): (&[f32], usize),
        (dst, ldd): (&mut [f32], usize),
        scaled: Option<(&mut [f32], &[f32])>,
    ) {
        let l = S::LANES;
        let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
        let scaled = scaled.map(|(d, f)| (d.as_mut_ptr(), f.as_ptr()));
        // Element (r, c) to both destinations.
        let put = |at: usize, c: usize, x: f32| {
            *dp.add(at) = x;
            if let Some((d, f)) = scaled {
                *d.add(at) = *f.add(c) * x;
            }
        };
        let (rl, cl) = (rows / l * l, cols / l * l);
        let mut r = 0;
        while r < rl {
            let rp: [*const f32; MAX_LANES] =
                core::array::from_fn(|i| sp.add((r + i.min(l - 1)) * lds));
            let mut c = 0;
            while c < cl {
                let tile = s.load_tile(&rp, c);
                for j in 0..l {
                    let (at, col) = ((c + j) * ldd + r, s.tile_col(&tile, j));
                    s.store(dp.add(at), col);
                    if let Some((d, f)) = scaled {
                        s.store(d.add(at), s.mul(s.broadcast(f.add(c + j)), col));
                    }
                }
                c += l;
            }
            for cc in cl..cols {
                for i in 0..l {
                    put(cc * ldd + r + i, cc, *sp.add((r + i) * lds + cc));
                }
            }
            r += l;
        }
        for rr in rl..rows {
            for cc in 0..cols {
                put(cc * ldd + rr, cc, *sp.add(rr * lds + cc));
            }
        }
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn tame_rows(t: &$crate::simd::chunk::kernels::Tame) -> bool {
                $crate::simd::chunk::kernels::tame_rows($token, t)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn transpose(
                shape: (usize, usize),
                src: (&[f32], usize),
                dst: (&mut [f32], usize),
                scaled: Option<(&mut [f32], &[f32])>,
            ) {
                $crate::simd::chunk::kernels::transpose($token, shape, src, dst, scaled)
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
    use crate::simd::{exp_in_place, Isa};
    use std::vec::Vec;

    #[test]
    fn transpose_every_shape() {
        for isa in test_paths() {
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
                assert!(transpose(isa, r, c, &src, c + 1, &mut dst, r + 2).is_ok());
                for i in 0..r {
                    for j in 0..c {
                        assert_eq!(dst[j * (r + 2) + i], src[i * (c + 1) + j]);
                    }
                }
                // With the scaled copy: the same transpose, and each product bit for bit.
                let scales = rnd(c, 22);
                let (mut plain, mut scaled) =
                    (std::vec![0.0; dst.len()], std::vec![0.0; dst.len()]);
                let shape = ((r, c), (&src[..], c + 1), (&mut plain[..], r + 2));
                assert!(
                    transpose_scaled(isa, shape.0, shape.1, shape.2, (&mut scaled, &scales))
                        .is_ok()
                );
                assert_eq!(plain, dst, "{isa:?} {r}x{c}");
                for i in 0..r {
                    for j in 0..c {
                        let want = scales[j] * src[i * (c + 1) + j];
                        let got = scaled[j * (r + 2) + i];
                        assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} {r}x{c} ({i}, {j})");
                    }
                }
                // A second output or scales too short: an error, nothing written.
                let mut short = std::vec![0.0; (c - 1) * (r + 2) + r - 1];
                let args = ((r, c), (&src[..], c + 1), (&mut plain[..], r + 2));
                assert!(
                    transpose_scaled(isa, args.0, args.1, args.2, (&mut short, &scales)).is_err()
                );
                assert!(short.iter().all(|&x| x == 0.0));
                let args = ((r, c), (&src[..], c + 1), (&mut plain[..], r + 2));
                let few = &scales[..c - 1];
                assert!(transpose_scaled(isa, args.0, args.1, args.2, (&mut scaled, few)).is_err());
            }
        }
    }

    /// `tame_rows` on every path: the reference's bits given the path's `exp` (every other
    /// operation is the same, in the same order), over shapes with column tails, strided
    /// inputs and one row; a spread past the limit, or a NaN, makes the chunk not tame.
    #[test]
    fn tame_rows_match_the_reference_bitwise() {
        struct Outs([Vec<f32>; 9]);
        impl Outs {
            fn new(l: usize, kd: usize) -> Self {
                Outs(core::array::from_fn(
                    |j| std::vec![f32::NAN; if j < 5 { l * kd } else { kd }],
                ))
            }
            fn view(&mut self) -> TameOut<'_> {
                let [qf, kf, kb, qd, kd, first, last, hi, lo] = &mut self.0;
                TameOut {
                    qf,
                    kf,
                    kb,
                    qd,
                    kd,
                    first,
                    last,
                    hi,
                    lo,
                }
            }
        }
        let bits = |o: &Outs| -> Vec<u32> { o.0.iter().flatten().map(|v| v.to_bits()).collect() };
        for path in test_paths() {
            let path_exp = |x: f32| {
                let mut e = [x];
                exp_in_place(path, &mut e);
                e[0]
            };
            for &(l, kd) in &[
                (1usize, 1usize),
                (3, 5),
                (7, 33),
                (16, 17),
                (16, 64),
                (16, 128),
            ] {
                let ld = kd + 3;
                let (q, k) = (rnd(l * ld, 31), rnd(l * ld, 32));
                let mut g: Vec<f32> = rnd(l * ld, 33).iter().map(|u| -0.3 * (1.5 + u)).collect();
                for (spill, want) in [(0.0f32, true), (-90.0, false), (f32::NAN, false)] {
                    if spill != 0.0 {
                        g[(l - 1) * ld + kd - 1] = spill;
                    }
                    let i = TameIn {
                        q: (&q, ld),
                        k: (&k, ld),
                        g: (&g, ld),
                        rows: l,
                        dim: kd,
                        scale: 0.125,
                        limit: 80.0,
                    };
                    let (mut got, mut exp_ref) = (Outs::new(l, kd), Outs::new(l, kd));
                    let tame = tame_rows(path, &i, &mut got.view()).unwrap();
                    let tame_ref = portable::tame_rows_with(&i, &mut exp_ref.view(), path_exp);
                    // One row has no spread: its chunk is always tame.
                    let want = want || l == 1 && !spill.is_nan();
                    assert_eq!(
                        (tame, tame_ref),
                        (want, want),
                        "{path:?} {l}x{kd} g={spill}"
                    );
                    if want {
                        assert_eq!(bits(&got), bits(&exp_ref), "{path:?} {l}x{kd}");
                    }
                }
            }
        }
        let short = TameIn {
            q: (&[0.0; 3], 3),
            k: (&[0.0; 3], 3),
            g: (&[0.0; 2], 3),
            rows: 1,
            dim: 3,
            scale: 1.0,
            limit: 80.0,
        };
        let mut o = Outs::new(1, 3);
        assert!(tame_rows(Isa::detect(), &short, &mut o.view()).is_err());
    }
}
