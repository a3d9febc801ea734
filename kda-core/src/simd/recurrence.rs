//! The recurrence's row passes over a `[K, V]` state (pass 1: decay and predict; pass 2:
//! write and read) and `axpy`: the safe wrappers, their kernels and their tests.

use super::{dispatch, portable, Path};

/// `y[i] += a·x[i]`.
#[inline]
pub fn axpy(isa: impl Into<Path>, a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    dispatch!(isa, axpy(a, x, y), portable::axpy(a, x, y))
}

/// Recurrence pass 1 for one key row: `s[i] *= decay; p[i] += k·s[i]`.
#[inline]
pub fn decay_predict(isa: impl Into<Path>, s: &mut [f32], decay: f32, k: f32, p: &mut [f32]) {
    let n = s.len().min(p.len());
    let (s, p) = (&mut s[..n], &mut p[..n]);
    dispatch!(
        isa,
        decay_predict(s, decay, k, p),
        portable::decay_predict(s, decay, k, p)
    )
}

/// Recurrence pass 1 over a whole state `s` `[K, V]` (`V = p.len()`): for each key row `d`,
/// `s[d] *= decay[d]; p += k[d]·s[d]` (one dispatch for all rows).
#[inline]
pub fn decay_predict_rows(
    isa: impl Into<Path>,
    s: &mut [f32],
    k: &[f32],
    decay: &[f32],
    p: &mut [f32],
) {
    decay_predict_rows_io(isa, (None, s), k, decay, p)
}

/// [`decay_predict_rows`] reading the state from `src` and writing the decayed rows to `dst`
/// (`src` is left as it was): `dst[d] = src[d]·decay[d]; p += k[d]·dst[d]`, bitwise the
/// in-place pass on a copy of `src`, without the copy's own pass over memory. Rows: as many as
/// `src`, `dst`, `k` and `decay` all hold.
#[inline]
pub fn decay_predict_rows_from(
    isa: impl Into<Path>,
    src: &[f32],
    dst: &mut [f32],
    k: &[f32],
    decay: &[f32],
    p: &mut [f32],
) {
    decay_predict_rows_io(isa, (Some(src), dst), k, decay, p)
}

/// Pass 1 from `src` (or in place) into `s`, over the rows every slice holds.
#[inline]
fn decay_predict_rows_io(
    isa: impl Into<Path>,
    (src, s): (Option<&[f32]>, &mut [f32]),
    k: &[f32],
    decay: &[f32],
    p: &mut [f32],
) {
    let v = p.len();
    if v == 0 {
        return;
    }
    let rows = (s.len() / v).min(k.len()).min(decay.len());
    let rows = src.map_or(rows, |x| rows.min(x.len() / v));
    let (s, k, decay) = (&mut s[..rows * v], &k[..rows], &decay[..rows]);
    let src = src.map(|x| &x[..rows * v]);
    dispatch!(
        isa,
        decay_predict_rows((src, s), k, decay, p),
        portable::decay_predict_rows((src, s), k, decay, p)
    )
}

/// Recurrence pass 2 over a whole state `s` `[K, V]` (`V = o.len()`): for each key row `d`,
/// `s[d] += k[d]·delta; o += (q[d]·scale)·s[d]` (one dispatch for all rows).
#[inline]
pub fn write_read_rows(
    isa: impl Into<Path>,
    s: &mut [f32],
    k: &[f32],
    delta: &[f32],
    (q, scale): (&[f32], f32),
    o: &mut [f32],
) {
    let v = o.len().min(delta.len());
    if v == 0 {
        return;
    }
    let (delta, o) = (&delta[..v], &mut o[..v]);
    let rows = (s.len() / v).min(k.len()).min(q.len());
    let (s, k, q) = (&mut s[..rows * v], &k[..rows], &q[..rows]);
    dispatch!(
        isa,
        write_read_rows(s, k, delta, (q, scale), o),
        portable::write_read_rows(s, k, delta, (q, scale), o)
    )
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use crate::simd::vector::Simd;

    /// `y[i] += a·x[i]` (`x` at least as long as `y`).
    #[inline(always)]
    pub(crate) unsafe fn axpy<S: Simd>(s: S, a: f32, x: &[f32], y: &mut [f32]) {
        let n = y.len();
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let av = s.splat(a);
        let mut i = 0;
        while i + S::LANES <= n {
            let v = s.mul_add(av, s.load(xp.add(i)), s.load(yp.add(i)));
            s.store(yp.add(i), v);
            i += S::LANES;
        }
        if i < n {
            let r = n - i;
            let v = s.mul_add(
                av,
                s.load_partial(xp.add(i), r),
                s.load_partial(yp.add(i), r),
            );
            s.store_partial(yp.add(i), r, v);
        }
    }

    /// One key row of recurrence pass 1: `s[i] *= decay; p[i] += k·s[i]` (`p` as long as `s`).
    #[inline(always)]
    pub(crate) unsafe fn decay_predict<S: Simd>(
        s: S,
        row: &mut [f32],
        decay: f32,
        k: f32,
        p: &mut [f32],
    ) {
        let n = row.len();
        let (sp, pp) = (row.as_mut_ptr(), p.as_mut_ptr());
        let (dv, kv) = (s.splat(decay), s.splat(k));
        let mut i = 0;
        while i + S::LANES <= n {
            let sv = s.mul(s.load(sp.add(i)), dv);
            s.store(sp.add(i), sv);
            s.store(pp.add(i), s.mul_add(kv, sv, s.load(pp.add(i))));
            i += S::LANES;
        }
        if i < n {
            let r = n - i;
            let sv = s.mul(s.load_partial(sp.add(i), r), dv);
            s.store_partial(sp.add(i), r, sv);
            let pv = s.mul_add(kv, sv, s.load_partial(pp.add(i), r));
            s.store_partial(pp.add(i), r, pv);
        }
    }

    /// One key row of recurrence pass 2: `s[i] += k·delta[i]; o[i] += q·s[i]`.
    #[inline(always)]
    unsafe fn write_read<S: Simd>(
        s: S,
        row: &mut [f32],
        k: f32,
        delta: &[f32],
        q: f32,
        o: &mut [f32],
    ) {
        let n = row.len();
        let (sp, dp, op) = (row.as_mut_ptr(), delta.as_ptr(), o.as_mut_ptr());
        let (kv, qv) = (s.splat(k), s.splat(q));
        let mut i = 0;
        while i + S::LANES <= n {
            let sv = s.mul_add(kv, s.load(dp.add(i)), s.load(sp.add(i)));
            s.store(sp.add(i), sv);
            s.store(op.add(i), s.mul_add(qv, sv, s.load(op.add(i))));
            i += S::LANES;
        }
        if i < n {
            let r = n - i;
            let sv = s.mul_add(
                kv,
                s.load_partial(dp.add(i), r),
                s.load_partial(sp.add(i), r),
            );
            s.store_partial(sp.add(i), r, sv);
            let ov = s.mul_add(qv, sv, s.load_partial(op.add(i), r));
            s.store_partial(op.add(i), r, ov);
        }
    }

    /// Pass 1 over a state `[K, V]` (`V = p.len()`, `state` a whole number of rows): for each
    /// key row `d`, `state[d] = from[d]·decay[d]; p += k[d]·state[d]`, where `from` is `src` (the
    /// same shape, e.g. an initial state that stays as it was) or, with `None`, `state` itself.
    /// Column blocks of 8 vectors (ISAs with 32 registers) or 4 outer, rows inner, so the block of
    /// `p` stays in registers: every element sees the rows in order, as the row by row form.
    #[inline(always)]
    pub(crate) unsafe fn decay_predict_rows<S: Simd>(
        s: S,
        (src, state): (Option<&[f32]>, &mut [f32]),
        k: &[f32],
        decay: &[f32],
        p: &mut [f32],
    ) {
        let (l, v) = (S::LANES, p.len());
        let rows = (state.len() / v).min(k.len()).min(decay.len());
        let dst = state.as_mut_ptr();
        let io = RowsIo {
            src: src.map_or(dst as *const f32, |x| x.as_ptr()),
            dst,
            v,
        };
        let mut j = 0;
        if S::REGISTERS >= 32 {
            while j + 8 * l <= v {
                decay_predict_cols::<S, 8>(s, io, (k, decay), rows, j, p);
                j += 8 * l;
            }
        }
        while j + 4 * l <= v {
            decay_predict_cols::<S, 4>(s, io, (k, decay), rows, j, p);
            j += 4 * l;
        }
        while j + l <= v {
            decay_predict_cols::<S, 1>(s, io, (k, decay), rows, j, p);
            j += l;
        }
        if j < v {
            for r in 0..rows {
                let row = &mut state[r * v + j..(r + 1) * v];
                if let Some(src) = src {
                    row.copy_from_slice(&src[r * v + j..(r + 1) * v]);
                }
                decay_predict(s, row, decay[r], k[r], &mut p[j..]);
            }
        }
    }

    /// Where pass 1 reads its rows (`src`) and writes them (`dst`, possibly the same memory), rows
    /// `v` elements apart.
    #[derive(Clone, Copy)]
    struct RowsIo {
        src: *const f32,
        dst: *mut f32,
        v: usize,
    }

    /// Columns `j..j + G·LANES` of pass 1 over the first `rows` rows.
    #[inline(always)]
    unsafe fn decay_predict_cols<S: Simd, const G: usize>(
        s: S,
        io: RowsIo,
        (k, decay): (&[f32], &[f32]),
        rows: usize,
        j: usize,
        p: &mut [f32],
    ) {
        let l = S::LANES;
        let pp = p.as_mut_ptr().add(j);
        let mut acc = [s.splat(0.0); G];
        for (g, a) in acc.iter_mut().enumerate() {
            *a = s.load(pp.add(g * l));
        }
        for r in 0..rows {
            let (dv, kv) = (s.splat(decay[r]), s.splat(k[r]));
            let (from, to) = (io.src.add(r * io.v + j), io.dst.add(r * io.v + j));
            for (g, acc) in acc.iter_mut().enumerate() {
                let sv = s.mul(s.load(from.add(g * l)), dv);
                s.store(to.add(g * l), sv);
                *acc = s.mul_add(kv, sv, *acc);
            }
        }
        for (g, acc) in acc.iter().enumerate() {
            s.store(pp.add(g * l), *acc);
        }
    }

    /// Pass 2 over a state `[K, V]` (`V = o.len()`): for each key row `d`,
    /// `s[d] += k[d]·delta; o += (q[d]·scale)·s[d]`. Blocked like [`decay_predict_rows`]: `delta`
    /// and `o` stay in registers.
    #[inline(always)]
    pub(crate) unsafe fn write_read_rows<S: Simd>(
        s: S,
        state: &mut [f32],
        k: &[f32],
        delta: &[f32],
        (q, scale): (&[f32], f32),
        o: &mut [f32],
    ) {
        let (l, v) = (S::LANES, o.len());
        let rows = (state.len() / v).min(k.len()).min(q.len());
        let mut j = 0;
        if S::REGISTERS >= 32 {
            while j + 8 * l <= v {
                write_read_cols::<S, 8>(s, state, (k, q, scale), rows, (j, delta), o);
                j += 8 * l;
            }
        }
        while j + 4 * l <= v {
            write_read_cols::<S, 4>(s, state, (k, q, scale), rows, (j, delta), o);
            j += 4 * l;
        }
        while j + l <= v {
            write_read_cols::<S, 1>(s, state, (k, q, scale), rows, (j, delta), o);
            j += l;
        }
        if j < v {
            for r in 0..rows {
                let row = &mut state[r * v + j..(r + 1) * v];
                write_read(s, row, k[r], &delta[j..], q[r] * scale, &mut o[j..]);
            }
        }
    }

    /// Columns `j..j + G·LANES` of pass 2 over the first `rows` rows.
    #[inline(always)]
    unsafe fn write_read_cols<S: Simd, const G: usize>(
        s: S,
        state: &mut [f32],
        (k, q, scale): (&[f32], &[f32], f32),
        rows: usize,
        (j, delta): (usize, &[f32]),
        o: &mut [f32],
    ) {
        let (l, v) = (S::LANES, o.len());
        let (sp, op, dp) = (
            state.as_mut_ptr(),
            o.as_mut_ptr().add(j),
            delta.as_ptr().add(j),
        );
        let (mut dv, mut acc) = ([s.splat(0.0); G], [s.splat(0.0); G]);
        for g in 0..G {
            dv[g] = s.load(dp.add(g * l));
            acc[g] = s.load(op.add(g * l));
        }
        for r in 0..rows {
            let (kv, qv) = (s.splat(k[r]), s.splat(q[r] * scale));
            let row = sp.add(r * v + j);
            for g in 0..G {
                let sv = s.mul_add(kv, dv[g], s.load(row.add(g * l)));
                s.store(row.add(g * l), sv);
                acc[g] = s.mul_add(qv, sv, acc[g]);
            }
        }
        for (g, acc) in acc.iter().enumerate() {
            s.store(op.add(g * l), *acc);
        }
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
                $crate::simd::recurrence::kernels::axpy($token, a, x, y)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn decay_predict(s: &mut [f32], decay: f32, kd: f32, p: &mut [f32]) {
                $crate::simd::recurrence::kernels::decay_predict($token, s, decay, kd, p)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn decay_predict_rows(
                s: (Option<&[f32]>, &mut [f32]),
                kd: &[f32],
                decay: &[f32],
                p: &mut [f32],
            ) {
                $crate::simd::recurrence::kernels::decay_predict_rows($token, s, kd, decay, p)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn write_read_rows(
                s: &mut [f32],
                kd: &[f32],
                delta: &[f32],
                q: (&[f32], f32),
                o: &mut [f32],
            ) {
                $crate::simd::recurrence::kernels::write_read_rows($token, s, kd, delta, q, o)
            }
        };
    }
    pub(crate) use entry_points;
}

super::instantiate!();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::portable;
    use crate::simd::test_support::{bits_eq, rnd, same, test_paths};

    #[test]
    fn every_path_matches_portable() {
        for path in test_paths() {
            for n in [0usize, 1, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 100, 128, 257] {
                let x = rnd(n, 1);
                let mut y1 = rnd(n, 7);
                let mut y2 = y1.clone();
                axpy(path, 0.3, &x, &mut y1);
                portable::axpy(0.3, &x, &mut y2);
                assert!(same(path, &y1, &y2, 1e-6), "{path:?} axpy n={n}");
                // A state of 3 key rows of n values.
                let (mut s1, mut p1) = (rnd(3 * n, 8), rnd(n, 9));
                let (mut s2, mut p2) = (s1.clone(), p1.clone());
                let (k, decay, q) = (rnd(3, 10), rnd(3, 11), rnd(3, 12));
                // From a source state into another buffer: bitwise the in-place pass, the
                // source untouched, whatever the buffer held.
                let (src, mut s3, mut p3) = (s1.clone(), rnd(3 * n, 13), p1.clone());
                decay_predict_rows_from(path, &src, &mut s3, &k, &decay, &mut p3);
                let mut s4 = src.clone();
                let mut p4 = p1.clone();
                portable::decay_predict_rows((Some(&src), &mut s4), &k, &decay, &mut p4);
                decay_predict_rows(path, &mut s1, &k, &decay, &mut p1);
                portable::decay_predict_rows((None, &mut s2), &k, &decay, &mut p2);
                assert!(same(path, &s1, &s2, 1e-6) && same(path, &p1, &p2, 1e-6));
                assert!(
                    bits_eq(&s3, &s1) && bits_eq(&p3, &p1),
                    "{path:?} from n={n}"
                );
                assert!(
                    bits_eq(&s4, &s2) && bits_eq(&p4, &p2),
                    "reference from n={n}"
                );
                assert!(
                    bits_eq(&src, &rnd(3 * n, 8)),
                    "{path:?} source changed n={n}"
                );
                write_read_rows(path, &mut s1, &k, &x, (&q, 1.3), &mut p1);
                portable::write_read_rows(&mut s2, &k, &x, (&q, 1.3), &mut p2);
                assert!(same(path, &s1, &s2, 1e-6) && same(path, &p1, &p2, 1e-6));
                decay_predict(path, &mut s1[..n], 0.7, 0.2, &mut p1);
                portable::decay_predict(&mut s2[..n], 0.7, 0.2, &mut p2);
                assert!(same(path, &s1, &s2, 1e-6) && same(path, &p1, &p2, 1e-6));
            }
        }
    }
}
