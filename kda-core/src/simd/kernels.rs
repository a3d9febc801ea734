//! Every SIMD kernel, written once over the [`Simd`] abstraction and instantiated per ISA by
//! [`instantiate!`] (one `#[target_feature]` entry point per kernel).
//!
//! Each kernel accumulates every output as one chain in the same order as the reference loops
//! of `portable.rs`, so with the portable instantiation (`Lanes<N>`, multiply then add) it gives
//! their results bitwise at any width; an ISA with FMA differs from them only by the fused
//! rounding (and `exp`). Width-dependent logic (tiles, blocks, tails) is therefore checked at
//! 4, 8 and 16 lanes on any machine.
//!
//! Contract of every function here: the caller (the safe wrappers in `simd/mod.rs`) has
//! checked the slice lengths, and the token proves the CPU has the ISA; all pointer offsets
//! stay within the checked lengths.

use half::bf16;

use super::vector::{column, round_pair, Elem, Simd, MAX_LANES};
use super::{ReadLoads, RowQueue, DIRECT, PANEL};

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
unsafe fn write_read<S: Simd>(s: S, row: &mut [f32], k: f32, delta: &[f32], q: f32, o: &mut [f32]) {
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

/// `x[i] = e^{x[i]}`: groups of [`EXP_GROUP`] vectors in lockstep ([`Simd::exp_n`]), then the
/// rest through [`map_in_place`].
#[inline(always)]
pub(crate) unsafe fn exp_in_place<S: Simd>(s: S, x: &mut [f32]) {
    let (p, step) = (x.as_mut_ptr(), EXP_GROUP * S::LANES);
    let mut i = 0;
    while i + step <= x.len() {
        let mut v = [s.splat(0.0); EXP_GROUP];
        for (j, v) in v.iter_mut().enumerate() {
            *v = s.load(p.add(i + j * S::LANES));
        }
        for (j, e) in s.exp_n(v).iter().enumerate() {
            s.store(p.add(i + j * S::LANES), *e);
        }
        i += step;
    }
    map_in_place(s, &mut x[i..], &Exp);
}

/// `e^x` ([`Simd::exp`]) as a [`LaneMap`].
struct Exp;

impl<S: Simd> LaneMap<S> for Exp {
    #[inline(always)]
    fn apply(&self, s: S, v: S::F) -> S::F {
        s.exp(v)
    }
}

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
                for line in super::line_starts(row, 4 * t.dim) {
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

/// Vectors whose exponents [`exp_in_place`] and [`tame_rows`] ([`tame_vectors`]) take in
/// lockstep ([`Simd::exp_n`]): 1.4× faster for `tame_rows` on Zen 4 (AVX-512 and AVX2) than
/// one vector at a time, 2 and 8 measured no better than 4.
const EXP_GROUP: usize = 4;

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

/// A function applied lane by lane ([`map_in_place`]). A trait rather than a closure: a
/// closure is not compiled with the entry point's target features, so the intrinsics inside
/// it would not inline.
trait LaneMap<S: Simd> {
    fn apply(&self, s: S, v: S::F) -> S::F;
}

/// `x[i] = f(x[i])`, `LANES` at a time, the tail through a partial vector.
#[inline(always)]
unsafe fn map_in_place<S: Simd>(s: S, x: &mut [f32], f: &impl LaneMap<S>) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let mut i = 0;
    while i + S::LANES <= n {
        s.store(p.add(i), f.apply(s, s.load(p.add(i))));
        i += S::LANES;
    }
    if i < n {
        let r = n - i;
        s.store_partial(p.add(i), r, f.apply(s, s.load_partial(p.add(i), r)));
    }
}

/// `c · sigmoid(x)`.
struct ScaledSigmoid(f32);

impl<S: Simd> LaneMap<S> for ScaledSigmoid {
    #[inline(always)]
    fn apply(&self, s: S, v: S::F) -> S::F {
        s.mul(s.splat(self.0), sigmoid(s, v))
    }
}

/// `c · softplus(x)`.
struct ScaledSoftplus(f32);

impl<S: Simd> LaneMap<S> for ScaledSoftplus {
    #[inline(always)]
    fn apply(&self, s: S, v: S::F) -> S::F {
        s.mul(s.splat(self.0), softplus(s, v))
    }
}

/// `1 / (1 + e^{−x})` with the ISA's `exp`.
#[inline(always)]
fn sigmoid<S: Simd>(s: S, x: S::F) -> S::F {
    let one = s.splat(1.0);
    s.div(one, s.add(one, s.exp(s.mul(x, s.splat(-1.0)))))
}

/// `x / (1 + e^{−x})` (SiLU) with the ISA's `exp`: the short conv's activation.
#[inline(always)]
fn silu<S: Simd>(s: S, x: S::F) -> S::F {
    let e = s.exp(s.mul(x, s.splat(-1.0)));
    s.div(x, s.add(s.splat(1.0), e))
}

/// The first `n` (`1..=LANES`) floats at `p`: a whole load when `n == LANES`.
#[inline(always)]
unsafe fn load_upto<S: Simd>(s: S, p: *const f32, n: usize) -> S::F {
    if n == S::LANES {
        s.load(p)
    } else {
        s.load_partial(p, n)
    }
}

/// Stores the first `n` (`1..=LANES`) lanes of `v` at `p`: a whole store when `n == LANES`.
#[inline(always)]
unsafe fn store_upto<S: Simd>(s: S, p: *mut f32, n: usize, v: S::F) {
    if n == S::LANES {
        s.store(p, v)
    } else {
        s.store_partial(p, n, v)
    }
}

/// `ln(1 + e^x)` as `max(x, 0) + ln(1 + e^{−|x|})`, the logarithm of `1 + y` (`0 ≤ y ≤ 1`)
/// as `2·atanh(y / (2 + y))`, a series in `z² ≤ 1/9` cut after `z¹³` (relative error below
/// 2·10⁻⁸ before rounding). Above 20 the result rounds to `x`, as torch's threshold returns;
/// `±∞` give `∞` and `0`; NaN stays NaN.
#[inline(always)]
fn softplus<S: Simd>(s: S, x: S::F) -> S::F {
    let m = s.zero_below(x, 0.0, x);
    // −|x| from a finite copy (so that ∞ − ∞ cannot appear); e^{−|x|} is 0 there anyway.
    let xc = s.clamp(x, -1e38, 1e38);
    let y = s.exp(s.mul_add(s.splat(-2.0), s.zero_below(xc, 0.0, xc), xc));
    let z = s.div(y, s.add(s.splat(2.0), y));
    let z2 = s.mul(z, z);
    let mut p = s.splat(1.0 / 13.0);
    for c in [1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0] {
        p = s.mul_add(p, z2, s.splat(c));
    }
    s.add(m, s.mul(s.add(z, z), p))
}

/// `x[i] = c · sigmoid(x[i])`.
#[inline(always)]
pub(crate) unsafe fn sigmoid_scaled<S: Simd>(s: S, x: &mut [f32], c: f32) {
    map_in_place(s, x, &ScaledSigmoid(c))
}

/// `x[i] = c · softplus(x[i])`.
#[inline(always)]
pub(crate) unsafe fn softplus_scaled<S: Simd>(s: S, x: &mut [f32], c: f32) {
    map_in_place(s, x, &ScaledSoftplus(c))
}

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
/// slack over the FMA latency) slowed the whole product (PERFORMANCE.md, eighteenth session).
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

/// Row pointers of a tile of weight rows, the last row repeated to fill `N`.
#[inline(always)]
fn row_ptrs<W, const N: usize>(ws: &[&[W]]) -> [*const W; N] {
    core::array::from_fn(|r| ws[r.min(ws.len() - 1)].as_ptr())
}

/// `panel[(k − k0)·16 + r] = W[r][k]` for `k0 ≤ k < k1` (rows past the last repeat it):
/// tiles transposed in registers, bf16 widened on the way, one column at a time at the end.
#[inline(always)]
pub(crate) unsafe fn pack_panel<S: Simd, W: Elem>(
    s: S,
    ws: &[&[W]],
    k0: usize,
    k1: usize,
    panel: &mut [f32],
) {
    let l = S::LANES;
    let rp: [*const W; PANEL] = row_ptrs(ws);
    let pp = panel.as_mut_ptr();
    let mut k = k0;
    while k + l <= k1 {
        for g in 0..PANEL / l {
            let tile = s.load_tile(&rp[g * l..], k);
            for j in 0..l {
                s.store(pp.add((k - k0 + j) * PANEL + g * l), s.tile_col(&tile, j));
            }
        }
        k += l;
    }
    while k < k1 {
        for g in 0..PANEL / l {
            s.store(pp.add((k - k0) * PANEL + g * l), column(s, &rp[g * l..], k));
        }
        k += 1;
    }
}

/// At most this many vectors per 16 outputs (4-lane ISAs).
const MAX_PER_PANEL: usize = 4;

/// `MT` tokens × `NP` panels of 16 outputs (`VP` vectors each, `16 / LANES`) of the packed
/// GEMM, continued over `kc` steps of each panel: token `t`'s accumulators of panel `q` at
/// `acc + t·ld + 16q`. `VP` is a parameter, not [`MAX_PER_PANEL`] vectors of which the first
/// `16 / LANES` are used: with the longer array LLVM kept one AVX2 accumulator on the stack
/// (a load and a store around its multiply-add in every step), and the AVX2 prefill GEMM ran
/// at 40 % of the FMA peak instead of about 90 %. With `NP` = 2 (AVX-512, see
/// [`Simd::PREFILL_PANELS`]) each broadcast input feeds two panels' vectors.
/// On [`Simd::BF16_PARITY`] paths a bf16 panel is read by parity: vectors `v`, `v + 1` then
/// hold the even and the odd outputs of the `2·LANES` from `v·LANES`, each output still one
/// chain in order.
#[inline(always)]
unsafe fn panel_block<S: Simd, W: Elem, const MT: usize, const VP: usize, const NP: usize>(
    s: S,
    x: [*const f32; MT],
    kc: usize,
    panels: [*const W; NP],
    (acc, ld): (*mut f32, usize),
    ahead: Option<[*const W; NP]>,
) {
    let parity = W::BF16 && S::BF16_PARITY && VP.is_multiple_of(2);
    let mut a = [[[s.splat(0.0); VP]; NP]; MT];
    for (t, a) in a.iter_mut().enumerate() {
        for (q, a) in a.iter_mut().enumerate() {
            *a = block_row_load::<S, VP>(s, acc.add(t * ld + q * PANEL), parity);
        }
    }
    for p in 0..kc {
        // (A loop, not `array::from_fn`: a closure does not inherit the caller's target
        // features, so its vector operations would not be inlined.)
        let mut b = [[s.splat(0.0); VP]; NP];
        for (q, b) in b.iter_mut().enumerate() {
            *b = panel_vectors::<S, W, VP>(s, panels[q].add(p * PANEL), parity);
        }
        if let Some(ahead) = ahead {
            for a in ahead {
                super::prefetch_line(a.wrapping_add(p * PANEL));
            }
        }
        for (t, a) in a.iter_mut().enumerate() {
            let xv = s.broadcast(x[t].add(p));
            for q in 0..NP {
                for v in 0..VP {
                    a[q][v] = s.mul_add(xv, b[q][v], a[q][v]);
                }
            }
        }
    }
    for (t, a) in a.iter().enumerate() {
        for (q, a) in a.iter().enumerate() {
            block_row_store::<S, VP>(s, acc.add(t * ld + q * PANEL), *a, parity);
        }
    }
}

/// One token's 16 accumulators of [`panel_block`] from `acc`, split by parity if `parity`.
#[inline(always)]
unsafe fn block_row_load<S: Simd, const VP: usize>(
    s: S,
    acc: *const f32,
    parity: bool,
) -> [S::F; VP] {
    let mut a = [s.splat(0.0); VP];
    for (v, a) in a.iter_mut().enumerate() {
        *a = s.load(acc.add(v * S::LANES));
    }
    if parity {
        for v in (0..VP).step_by(2) {
            (a[v], a[v + 1]) = s.deinterleave(a[v], a[v + 1]);
        }
    }
    a
}

/// Stores what [`block_row_load`] loaded, back in order.
#[inline(always)]
unsafe fn block_row_store<S: Simd, const VP: usize>(
    s: S,
    acc: *mut f32,
    mut a: [S::F; VP],
    parity: bool,
) {
    if parity {
        for v in (0..VP).step_by(2) {
            (a[v], a[v + 1]) = s.interleave(a[v], a[v + 1]);
        }
    }
    for (v, a) in a.iter().enumerate() {
        s.store(acc.add(v * S::LANES), *a);
    }
}

/// One step of a packed panel (16 values at `row`) as `VP` vectors: in order, or by parity
/// (`parity` only for bf16 panels).
#[inline(always)]
unsafe fn panel_vectors<S: Simd, W: Elem, const VP: usize>(
    s: S,
    row: *const W,
    parity: bool,
) -> [S::F; VP] {
    let mut b = [s.splat(0.0); VP];
    if parity {
        debug_assert!(W::BF16);
        let row = row as *const bf16;
        for v in (0..VP).step_by(2) {
            (b[v], b[v + 1]) = s.load_bf16_parity(row.add(v * S::LANES));
        }
    } else {
        for (v, b) in b.iter_mut().enumerate() {
            *b = W::load(s, row.add(v * S::LANES));
        }
    }
    b
}

/// `$block!(MT)` for `MT = $n` tokens (1 to 12; the register blocks of the packed GEMMs): a
/// const instantiation per token count.
macro_rules! by_tokens {
    ($n:expr, $block:ident) => {
        match $n {
            12 => $block!(12),
            11 => $block!(11),
            10 => $block!(10),
            9 => $block!(9),
            8 => $block!(8),
            7 => $block!(7),
            6 => $block!(6),
            5 => $block!(5),
            4 => $block!(4),
            3 => $block!(3),
            2 => $block!(2),
            _ => $block!(1),
        }
    };
}

/// `$block!(VP, NP)` for a prefill register block of `NP` panels (`$np`, 1 or
/// [`Simd::PREFILL_PANELS`]) of `VP = 16 / LANES` vectors each: the shapes the ISAs use
/// (16 lanes: one or two panels; 8 and 4 lanes: one panel).
macro_rules! by_panel_shape {
    ($s:ty, $np:expr, $block:ident) => {
        match (PANEL / <$s>::LANES, $np) {
            (1, 1) => $block!(1, 1),
            (1, _) => $block!(1, 2),
            (2, _) => $block!(2, 1),
            _ => $block!(4, 1),
        }
    };
}

/// `$block!(MT, P)` for `(tokens, panels)` of the decode kernels: `P` a power of two, at most
/// 8 panels for one or two tokens and 4 for more ([`decode_group`] picks it).
macro_rules! by_tokens_panels {
    ($tp:expr, $block:ident) => {
        match $tp {
            (1, 8) => $block!(1, 8),
            (1, 4) => $block!(1, 4),
            (1, 2) => $block!(1, 2),
            (1, _) => $block!(1, 1),
            (2, 8) => $block!(2, 8),
            (2, 4) => $block!(2, 4),
            (2, 2) => $block!(2, 2),
            (2, _) => $block!(2, 1),
            (3, 4) => $block!(3, 4),
            (3, 2) => $block!(3, 2),
            (3, _) => $block!(3, 1),
            (4, 4) => $block!(4, 4),
            (4, 2) => $block!(4, 2),
            _ => $block!(4, 1),
        }
    };
}

/// Steps of one panel a decode kernel reads before it moves to the next panel: 16 bf16 rows,
/// 512 contiguous bytes. On Zen 4, eight panels read this way reach the read limit of eight
/// far-apart streams; four panels a row (32 bytes) at a time stayed 10–15 % below it.
const DECODE_BLOCK: usize = 16;

/// `$body` once for each panel `$p` in `0..$n` (`$n` ≤ 8, a const generic), written out with
/// a constant `$p` each time. A loop over the panels whose body holds a loop of its own is not
/// unrolled by LLVM, and its variable index into the accumulator array keeps every accumulator
/// in memory (a load and a store around each multiply-add); constant indices keep them in
/// registers.
macro_rules! each_panel {
    ($n:expr, $p:ident => $body:expr) => {{
        each_panel!(@ $n, $p, $body, 0 1 2 3 4 5 6 7)
    }};
    (@ $n:expr, $p:ident, $body:expr, $($i:literal)*) => {{
        const _: () = assert!(super::DECODE_PANELS <= 8);
        $(
            if $i < $n {
                let $p: usize = $i;
                $body;
            }
        )*
    }};
}

/// Panels a decode kernel streams at once for `tokens` tokens of `remaining` panels: as many
/// as keep the accumulators within half the registers, at most [`super::DECODE_PANELS`], a
/// power of two (8 for one token on AVX-512, 4 on AVX2 and NEON).
#[inline(always)]
fn decode_group<S: Simd>(tokens: usize, remaining: usize) -> usize {
    let vp = PANEL / S::LANES;
    let fit = (S::REGISTERS / 2 / vp / tokens.max(1)).clamp(1, super::DECODE_PANELS);
    let most = fit.min(remaining).max(1);
    1 << most.ilog2()
}

/// The decode accumulators of `MT` tokens × `P` panels, `acc[t·DECODE_LD + 16p + r]`, loaded
/// into registers (`a[p][t][v]`).
#[inline(always)]
unsafe fn decode_acc_load<S: Simd, const MT: usize, const P: usize>(
    s: S,
    acc: *const f32,
) -> [[[S::F; MAX_PER_PANEL]; MT]; P] {
    let mut a = [[[s.splat(0.0); MAX_PER_PANEL]; MT]; P];
    for (p, a) in a.iter_mut().enumerate() {
        for (t, a) in a.iter_mut().enumerate() {
            for (v, a) in a.iter_mut().enumerate().take(PANEL / S::LANES) {
                *a = s.load(acc.add(t * super::DECODE_LD + p * PANEL + v * S::LANES));
            }
        }
    }
    a
}

/// Stores what [`decode_acc_load`] loaded.
#[inline(always)]
unsafe fn decode_acc_store<S: Simd, const MT: usize, const P: usize>(
    s: S,
    acc: *mut f32,
    a: &[[[S::F; MAX_PER_PANEL]; MT]; P],
) {
    for (p, a) in a.iter().enumerate() {
        for (t, a) in a.iter().enumerate() {
            for (v, a) in a.iter().enumerate().take(PANEL / S::LANES) {
                s.store(acc.add(t * super::DECODE_LD + p * PANEL + v * S::LANES), *a);
            }
        }
    }
}

/// `(start, len)` of `⌈n / most⌉` consecutive blocks covering `0..n`, at most `most` long and
/// as even as they go: the first `n % blocks` take one more.
#[inline(always)]
fn even_blocks(n: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let blocks = n.div_ceil(most);
    let (base, extra) = (n / blocks.max(1), n % blocks.max(1));
    (0..blocks).map(move |b| (b * base + b.min(extra), base + usize::from(b < extra)))
}

/// Continues `acc[t·ld + 16p + r]` over `k0..k1` from each packed panel `p` of `panels` (f32,
/// or bf16 in the panel layout, widened as it is loaded; each starting at step `k0`): tokens
/// in register blocks of at most [`Simd::PANEL_TOKENS`], sized as evenly as they go (256 =
/// 14·12 + 8·11, not 21·12 + 4: a block of a few tokens has too few chains per load), each
/// block over the panels in turn, [`Simd::prefill_panels`] at a time, while its inputs are in
/// L1.
#[inline(always)]
pub(crate) unsafe fn panel_fma<S: Simd, W: Elem>(
    s: S,
    xs: &[&[f32]],
    (k0, k1): (usize, usize),
    panels: &[&[W]],
    (acc, ld): (&mut [f32], usize),
    ahead: &[&[W]],
) {
    let ap = acc.as_mut_ptr();
    let kc = k1 - k0;
    // The first register block prefetches `ahead[p..p + np]` with panels `p..p + np`, a line
    // per step or two, if every `ahead` slice holds the `kc` steps.
    let ahead_ok = ahead.iter().all(|h| h.len() >= kc * PANEL);
    for (b, (t0, mt)) in even_blocks(xs.len(), S::PANEL_TOKENS).enumerate() {
        let xg = &xs[t0..t0 + mt];
        let mut p = 0;
        while p < panels.len() {
            let np = s.prefill_panels().min(panels.len() - p);
            let a = ap.add(t0 * ld + p * PANEL);
            let pf = b == 0 && ahead_ok && ahead.len() >= p + np;
            macro_rules! shape {
                ($vp:literal, $np:literal) => {{
                    macro_rules! block {
                        ($mt:literal) => {{
                            let x: [*const f32; $mt] =
                                core::array::from_fn(|t| xg[t].as_ptr().add(k0));
                            let pp: [*const W; $np] =
                                core::array::from_fn(|q| panels[p + q].as_ptr());
                            let h = pf.then(|| core::array::from_fn(|q| ahead[p + q].as_ptr()));
                            panel_block::<S, W, $mt, $vp, $np>(s, x, kc, pp, (a, ld), h)
                        }};
                    }
                    by_tokens!(mt, block)
                }};
            }
            by_panel_shape!(S, np, shape);
            p += np;
        }
    }
}

/// `MT` tokens × `G` vectors of weight rows straight from the row-major weights: each tile
/// is transposed in registers and consumed at once (no packing, for decode).
#[inline(always)]
unsafe fn rows_block<S: Simd, W: Elem, const MT: usize, const G: usize>(
    s: S,
    x: [*const f32; MT],
    rp: &[*const W],
    (k0, k1): (usize, usize),
    acc: *mut f32,
) {
    let l = S::LANES;
    let mut a = [[s.splat(0.0); G]; MT];
    for (t, a) in a.iter_mut().enumerate() {
        for (g, a) in a.iter_mut().enumerate() {
            *a = s.load(acc.add(t * DIRECT + g * l));
        }
    }
    let mut k = k0;
    while k + l <= k1 {
        for g in 0..G {
            let tile = s.load_tile(&rp[g * l..], k);
            for j in 0..l {
                let c = s.tile_col(&tile, j);
                for (t, a) in a.iter_mut().enumerate() {
                    a[g] = s.mul_add(s.broadcast(x[t].add(k + j)), c, a[g]);
                }
            }
        }
        k += l;
    }
    while k < k1 {
        for g in 0..G {
            let c = column(s, &rp[g * l..], k);
            for (t, a) in a.iter_mut().enumerate() {
                a[g] = s.mul_add(s.broadcast(x[t].add(k)), c, a[g]);
            }
        }
        k += 1;
    }
    for (t, a) in a.iter().enumerate() {
        for (g, a) in a.iter().enumerate() {
            s.store(acc.add(t * DIRECT + g * l), *a);
        }
    }
}

/// Continues `acc[t·32 + r]` over `k0..k1` straight from up to 32 weight rows. One token
/// (decode) streams [`Simd::DECODE_ROWS`] rows at a time; more tokens go 16 rows × up to 4
/// tokens at a time.
#[inline(always)]
pub(crate) unsafe fn rows_fma<S: Simd, W: Elem>(
    s: S,
    xs: &[&[f32]],
    ws: &[&[W]],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    let rp: [*const W; DIRECT] = row_ptrs(ws);
    let ap = acc.as_mut_ptr();
    if xs.len() == 1 {
        let (x, step) = ([xs[0].as_ptr()], S::DECODE_ROWS);
        for r in (0..ws.len()).step_by(step) {
            let (rr, a) = (&rp[r..], ap.add(r));
            match step / S::LANES {
                1 => rows_block::<S, W, 1, 1>(s, x, rr, (k0, k1), a),
                2 => rows_block::<S, W, 1, 2>(s, x, rr, (k0, k1), a),
                _ => rows_block::<S, W, 1, 4>(s, x, rr, (k0, k1), a),
            }
        }
        return;
    }
    for r in (0..ws.len()).step_by(16) {
        let rr = &rp[r..];
        for (g, xg) in xs.chunks(4).enumerate() {
            let a = ap.add(g * 4 * DIRECT + r);
            macro_rules! block {
                ($mt:literal) => {{
                    let x: [*const f32; $mt] = core::array::from_fn(|t| xg[t].as_ptr());
                    match 16 / S::LANES {
                        1 => rows_block::<S, W, $mt, 1>(s, x, rr, (k0, k1), a),
                        2 => rows_block::<S, W, $mt, 2>(s, x, rr, (k0, k1), a),
                        _ => rows_block::<S, W, $mt, 4>(s, x, rr, (k0, k1), a),
                    }
                }};
            }
            match xg.len() {
                4 => block!(4),
                3 => block!(3),
                2 => block!(2),
                _ => block!(1),
            }
        }
    }
}

/// `MT` tokens × `P` panels of 16 rows straight from bf16 panel-layout weights (element
/// `(k, r)` of panel `p` at `pp[p] + 16k + r`): [`DECODE_BLOCK`] steps of each panel in turn.
/// Every output's chain runs over `k` in order, so the sums are those of a one-panel loop.
#[inline(always)]
unsafe fn panels_block<S: Simd, const MT: usize, const P: usize>(
    s: S,
    x: [*const f32; MT],
    pp: [*const bf16; P],
    (k0, k1): (usize, usize),
    acc: *mut f32,
) {
    let mut a = decode_acc_load::<S, MT, P>(s, acc);
    if S::LANE_FMA {
        // NEON's by-element FMA: every panel per load of the inputs, a row at a time (the
        // 16-step blocks below, eight steps per load of the inputs, cost NEON 8 % more
        // instructions per token, and no ARM machine measured what they gain).
        panel_steps_lanes(s, &x, &pp, (k0, k1), &mut a);
    } else {
        let mut k = k0;
        while k < k1 {
            let kb = (k + DECODE_BLOCK).min(k1);
            if MT == 1 && kb - k == DECODE_BLOCK {
                // One token: a constant count of steps, written out without a loop (a third
                // fewer instructions on AVX2). More tokens keep the loop: written out, LLVM
                // hoists the inputs the panels share, spills them and mixes the panels' reads.
                let xk: [*const f32; MT] = core::array::from_fn(|t| x[t].add(k));
                each_panel!(P, p => {
                    let row = pp[p].add(k * PANEL);
                    for i in 0..DECODE_BLOCK {
                        let xi = core::array::from_fn(|t| xk[t].add(i));
                        panel_step(s, &xi, row.add(i * PANEL), &mut a[p]);
                    }
                });
            } else {
                each_panel!(P, p => panel_steps(s, &x, pp[p], (k, kb), &mut a[p]));
            }
            k = kb;
        }
    }
    decode_acc_store(s, acc, &a);
}

/// [`panels_block`] on a [`Simd::LANE_FMA`] ISA: steps `k0..k1` of every panel, eight steps
/// per load of each token's next inputs, taken by lane (eight halve the loop's own
/// instructions; sixteen spill); then [`panel_steps`] for the last few.
#[inline(always)]
unsafe fn panel_steps_lanes<S: Simd, const MT: usize, const P: usize>(
    s: S,
    x: &[*const f32; MT],
    pp: &[*const bf16; P],
    (k0, k1): (usize, usize),
    a: &mut [[[S::F; MAX_PER_PANEL]; MT]; P],
) {
    debug_assert!(S::LANE_FMA && S::LANES == 4);
    let mut k = k0;
    while k + 8 <= k1 {
        // `k + 8 ≤ k1`, and LANE_FMA implies LANES == 4.
        let (mut xq, mut xr) = ([s.splat(0.0); MT], [s.splat(0.0); MT]);
        for t in 0..MT {
            xq[t] = s.load(x[t].add(k));
            xr[t] = s.load(x[t].add(k + 4));
        }
        panels_lane_step::<S, MT, P, 0>(s, &xq, pp, k, a);
        panels_lane_step::<S, MT, P, 1>(s, &xq, pp, k + 1, a);
        panels_lane_step::<S, MT, P, 2>(s, &xq, pp, k + 2, a);
        panels_lane_step::<S, MT, P, 3>(s, &xq, pp, k + 3, a);
        panels_lane_step::<S, MT, P, 0>(s, &xr, pp, k + 4, a);
        panels_lane_step::<S, MT, P, 1>(s, &xr, pp, k + 5, a);
        panels_lane_step::<S, MT, P, 2>(s, &xr, pp, k + 6, a);
        panels_lane_step::<S, MT, P, 3>(s, &xr, pp, k + 7, a);
        k += 8;
    }
    each_panel!(P, p => panel_steps(s, x, pp[p], (k, k1), &mut a[p]));
}

/// Steps `k0..k1` of one bf16 panel for every token of [`panels_block`].
#[inline(always)]
unsafe fn panel_steps<S: Simd, const MT: usize>(
    s: S,
    x: &[*const f32; MT],
    panel: *const bf16,
    (k0, k1): (usize, usize),
    a: &mut [[S::F; MAX_PER_PANEL]; MT],
) {
    debug_assert!(!S::LANE_FMA || S::LANES == 4);
    let mut k = k0;
    if S::LANE_FMA {
        // Four steps per load of each token's next inputs, taken by lane.
        while k + 4 <= k1 {
            // `k + 4 ≤ k1`, and LANE_FMA implies LANES == 4.
            let mut xq = [s.splat(0.0); MT];
            for (xq, x) in xq.iter_mut().zip(x) {
                *xq = s.load(x.add(k));
            }
            panel_lane_step::<S, MT, 0>(s, &xq, panel.add(k * PANEL), a);
            panel_lane_step::<S, MT, 1>(s, &xq, panel.add((k + 1) * PANEL), a);
            panel_lane_step::<S, MT, 2>(s, &xq, panel.add((k + 2) * PANEL), a);
            panel_lane_step::<S, MT, 3>(s, &xq, panel.add((k + 3) * PANEL), a);
            k += 4;
        }
    }
    for k in k..k1 {
        let xk = core::array::from_fn(|t| x[t].add(k));
        panel_step(s, &xk, panel.add(k * PANEL), a);
    }
}

/// One step of one bf16 panel for every token: the panel row at `row` times each token's
/// input at `x[t]`. (Pointers to the step itself, not a step index: LLVM then addresses the
/// steps of a written-out block by constant offsets instead of keeping an index per step.)
#[inline(always)]
unsafe fn panel_step<S: Simd, const MT: usize>(
    s: S,
    x: &[*const f32; MT],
    row: *const bf16,
    a: &mut [[S::F; MAX_PER_PANEL]; MT],
) {
    let b = panel_row(s, row);
    for (a, x) in a.iter_mut().zip(x) {
        let xv = s.broadcast(*x);
        for v in 0..PANEL / S::LANES {
            a[v] = s.mul_add(xv, b[v], a[v]);
        }
    }
}

/// Row `k` of a bf16 panel (16 values) as `PANEL / LANES` vectors, widened in pairs.
#[inline(always)]
unsafe fn panel_row<S: Simd>(s: S, p: *const bf16) -> [S::F; MAX_PER_PANEL] {
    let mut b = [s.splat(0.0); MAX_PER_PANEL];
    let vp = PANEL / S::LANES;
    if vp == 1 {
        b[0] = s.load_bf16(p);
    } else {
        for v in (0..vp).step_by(2) {
            (b[v], b[v + 1]) = s.load_bf16_pair(p.add(v * S::LANES));
        }
    }
    b
}

/// One panel row (at `row`) times lane `J` of each token's `xq` (the [`Simd::LANE_FMA`] path
/// of [`panel_steps`]: the same multiply-adds in the same order as its broadcast path).
#[inline(always)]
unsafe fn panel_lane_step<S: Simd, const MT: usize, const J: i32>(
    s: S,
    xq: &[S::F; MT],
    row: *const bf16,
    a: &mut [[S::F; MAX_PER_PANEL]; MT],
) {
    let b = panel_row(s, row);
    for (a, xq) in a.iter_mut().zip(xq) {
        for v in 0..PANEL / S::LANES {
            a[v] = s.mul_add_lane::<J>(*xq, b[v], a[v]);
        }
    }
}

/// Step `k` of every panel times lane `J` of each token's `xq` (panels written out by
/// `each_panel!`, so every accumulator stays in a register).
#[inline(always)]
unsafe fn panels_lane_step<S: Simd, const MT: usize, const P: usize, const J: i32>(
    s: S,
    xq: &[S::F; MT],
    pp: &[*const bf16; P],
    k: usize,
    a: &mut [[[S::F; MAX_PER_PANEL]; MT]; P],
) {
    each_panel!(P, p => panel_lane_step::<S, MT, J>(s, xq, pp[p].add(k * PANEL), &mut a[p]));
}

/// Continues `acc[t·DECODE_LD + 16p + r]` over `k0..k1` for up to 4 tokens × up to
/// [`super::DECODE_PANELS`] panels, streamed in groups of [`decode_group`] panels.
#[inline(always)]
pub(crate) unsafe fn panels_fma<S: Simd>(
    s: S,
    xs: &[&[f32]],
    panels: &[&[bf16]],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    let ap = acc.as_mut_ptr();
    let mut p0 = 0;
    while p0 < panels.len() {
        let np = decode_group::<S>(xs.len(), panels.len() - p0);
        let a = ap.add(p0 * PANEL);
        macro_rules! block {
            ($mt:literal, $p:literal) => {{
                let x: [*const f32; $mt] = core::array::from_fn(|t| xs[t].as_ptr());
                let pp: [*const bf16; $p] = core::array::from_fn(|p| panels[p0 + p].as_ptr());
                panels_block::<S, $mt, $p>(s, x, pp, (k0, k1), a)
            }};
        }
        by_tokens_panels!((xs.len(), np), block);
        p0 += np;
    }
}

/// A row of zeros: the odd half of the last pair when a panel has an odd number of steps.
static ZERO_ROW: [bf16; PANEL] = [bf16::ZERO; PANEL];

/// Pair `j` of a bf16 panel (steps `2j` at `lo` and `2j + 1` at `hi`, 16 values each) as
/// `PANEL / LANES` pair vectors.
#[inline(always)]
unsafe fn pairs_row<S: Simd>(s: S, lo: *const bf16, hi: *const bf16) -> [S::P; MAX_PER_PANEL] {
    let mut b = [s.load_pairs(lo, hi); MAX_PER_PANEL];
    for (v, b) in b.iter_mut().enumerate().take(PANEL / S::LANES).skip(1) {
        *b = s.load_pairs(lo.add(v * S::LANES), hi.add(v * S::LANES));
    }
    b
}

/// Where pair `j` of a panel lies: its two rows, the second a zero row for the `tail` pair
/// of a panel with an odd number of steps. Callers pass a literal `tail`, so the main loop
/// compiles to adjacent rows with no test.
#[inline(always)]
unsafe fn pair_rows(panel: *const bf16, j: usize, tail: bool) -> (*const bf16, *const bf16) {
    let lo = panel.add(2 * j * PANEL);
    let hi = if tail {
        ZERO_ROW.as_ptr()
    } else {
        lo.add(PANEL)
    };
    (lo, hi)
}

/// Pairs `j0..j1` of a panel of `n` steps as (the whole pairs, the half pair at the end of an
/// odd `n` if it is in range).
#[inline(always)]
fn pair_split(
    (j0, j1, n): (usize, usize, usize),
) -> (core::ops::Range<usize>, core::ops::Range<usize>) {
    let full = j1.min(n / 2).max(j0);
    (j0..full, full..j1)
}

/// `MT` tokens × `NP` panels of 16 outputs (`VP` vectors each) of the bf16-pairs GEMM over
/// pairs `j0..j1` of panels of `n` steps (token `t`'s accumulators of panel `q` at
/// `acc + t·ld + 16q`): every output continues its chain `acc ← dot_pairs(acc, w_j, x_j)` over
/// `j` in order. Exact-size arrays, as [`panel_block`]'s.
/// (Two panels sharing each broadcast pair measured 8 % slower on Zen 4 in the twelfth session
/// and faster on Zen 5 in the sixteenth; see [`Simd::PREFILL_PANELS`].)
#[inline(always)]
unsafe fn pairs_block<S: Simd, const MT: usize, const VP: usize, const NP: usize>(
    s: S,
    x: [*const u32; MT],
    (j0, j1, n): (usize, usize, usize),
    panels: [*const bf16; NP],
    (acc, ld): (*mut f32, usize),
    ahead: Option<[*const bf16; NP]>,
) {
    let mut a = [[[s.splat(0.0); VP]; NP]; MT];
    for (t, a) in a.iter_mut().enumerate() {
        for (q, a) in a.iter_mut().enumerate() {
            for (v, a) in a.iter_mut().enumerate() {
                *a = s.load(acc.add(t * ld + q * PANEL + v * S::LANES));
            }
        }
    }
    let (full, tail) = pair_split((j0, j1, n));
    for j in full {
        pairs_block_step(s, &x, j, (panels, false), &mut a);
        if let Some(ahead) = ahead {
            for h in ahead {
                super::prefetch_line(h.wrapping_add(2 * j * PANEL));
            }
        }
    }
    for j in tail {
        pairs_block_step(s, &x, j, (panels, true), &mut a);
    }
    for (t, a) in a.iter().enumerate() {
        for (q, a) in a.iter().enumerate() {
            for (v, a) in a.iter().enumerate() {
                s.store(acc.add(t * ld + q * PANEL + v * S::LANES), *a);
            }
        }
    }
}

/// Pair `j` of each panel of [`pairs_block`] (`tail`: the half pair of an odd step count,
/// see [`pair_rows`]) for every token.
#[inline(always)]
unsafe fn pairs_block_step<S: Simd, const MT: usize, const VP: usize, const NP: usize>(
    s: S,
    x: &[*const u32; MT],
    j: usize,
    (panels, tail): ([*const bf16; NP], bool),
    a: &mut [[[S::F; VP]; NP]; MT],
) {
    // Loops, not `array::from_fn` (see `panel_block`). The fill value is dead: every element
    // is loaded below (`S::P` has no zero of its own).
    let mut b = [[s.broadcast_pair(x[0].add(j)); VP]; NP];
    for (q, b) in b.iter_mut().enumerate() {
        let (lo, hi) = pair_rows(panels[q], j, tail);
        for (v, b) in b.iter_mut().enumerate() {
            *b = s.load_pairs(lo.add(v * S::LANES), hi.add(v * S::LANES));
        }
    }
    for (t, a) in a.iter_mut().enumerate() {
        let xv = s.broadcast_pair(x[t].add(j));
        for q in 0..NP {
            for v in 0..VP {
                a[q][v] = s.dot_pairs(a[q][v], b[q][v], xv);
            }
        }
    }
}

/// Pair `j` (its weight rows `lo`, `hi`) of the decode's [`pairs_panels_block`] for every
/// token.
#[inline(always)]
unsafe fn pairs_step<S: Simd, const MT: usize>(
    s: S,
    x: &[*const u32; MT],
    j: usize,
    (lo, hi): (*const bf16, *const bf16),
    a: &mut [[S::F; MAX_PER_PANEL]; MT],
) {
    let b = pairs_row(s, lo, hi);
    for (t, a) in a.iter_mut().enumerate() {
        let xv = s.broadcast_pair(x[t].add(j));
        for v in 0..PANEL / S::LANES {
            a[v] = s.dot_pairs(a[v], b[v], xv);
        }
    }
}

/// Continues, for each panel `p` of `panels` (bf16, the panel layout, `n` steps from step 0),
/// `acc[t·ld + 16p + r]` over pairs `j0..j1` for token rows of bf16 pairs `xs[t]` (from
/// [`round_pairs_row`]): the bf16 precision mode's prefill GEMM, its tokens in register
/// blocks as [`panel_fma`]'s, each block over the panels in turn,
/// [`Simd::prefill_panels`] at a time.
#[inline(always)]
pub(crate) unsafe fn pairs_panel_fma<S: Simd>(
    s: S,
    xs: &[&[u32]],
    (j0, j1, n): (usize, usize, usize),
    panels: &[&[bf16]],
    (acc, ld): (&mut [f32], usize),
    ahead: &[&[bf16]],
) {
    let ap = acc.as_mut_ptr();
    for (b, (t0, mt)) in even_blocks(xs.len(), S::PANEL_TOKENS).enumerate() {
        let xg = &xs[t0..t0 + mt];
        let mut p = 0;
        while p < panels.len() {
            let np = s.prefill_panels().min(panels.len() - p);
            let a = ap.add(t0 * ld + p * PANEL);
            // As `panel_fma`'s: the first register block prefetches `ahead[p..p + np]` (each
            // from pair `j0`; addressed as the panels are, from pair 0).
            let pf = b == 0 && ahead.len() >= p + np;
            macro_rules! shape {
                ($vp:literal, $np:literal) => {{
                    macro_rules! block {
                        ($mt:literal) => {{
                            let x: [*const u32; $mt] = core::array::from_fn(|t| xg[t].as_ptr());
                            let pp: [*const bf16; $np] =
                                core::array::from_fn(|q| panels[p + q].as_ptr());
                            let h = pf.then(|| {
                                core::array::from_fn(|q| {
                                    ahead[p + q].as_ptr().wrapping_sub(2 * j0 * PANEL)
                                })
                            });
                            let steps = (j0, j1, n);
                            pairs_block::<S, $mt, $vp, $np>(s, x, steps, pp, (a, ld), h)
                        }};
                    }
                    by_tokens!(mt, block)
                }};
            }
            by_panel_shape!(S, np, shape);
            p += np;
        }
    }
}

/// `MT` tokens × `P` panels of the bf16-pairs GEMM over pairs `j0..j1` (decode: every weight
/// read once per step), [`DECODE_BLOCK`] steps of each panel in turn. The same chains as
/// [`pairs_block`].
#[inline(always)]
unsafe fn pairs_panels_block<S: Simd, const MT: usize, const P: usize>(
    s: S,
    x: [*const u32; MT],
    pp: [*const bf16; P],
    (j0, j1, n): (usize, usize, usize),
    acc: *mut f32,
) {
    let mut a = decode_acc_load::<S, MT, P>(s, acc);
    let (full, tail) = pair_split((j0, j1, n));
    const PAIRS: usize = DECODE_BLOCK / 2;
    let mut j = full.start;
    while j < full.end {
        if j + PAIRS <= full.end {
            // A constant count of pairs, so that LLVM writes the block out without a loop.
            each_panel!(P, p => for j in j..j + PAIRS {
                pairs_step(s, &x, j, pair_rows(pp[p], j, false), &mut a[p]);
            });
            j += PAIRS;
        } else {
            each_panel!(P, p => for j in j..full.end {
                pairs_step(s, &x, j, pair_rows(pp[p], j, false), &mut a[p]);
            });
            j = full.end;
        }
    }
    for j in tail {
        each_panel!(P, p => pairs_step(s, &x, j, pair_rows(pp[p], j, true), &mut a[p]));
    }
    decode_acc_store(s, acc, &a);
}

/// Continues `acc[t·DECODE_LD + 16p + r]` over pairs `j0..j1` for up to 4 tokens × up to
/// [`super::DECODE_PANELS`] bf16 panels of `n` steps (the bf16 mode's decode; the same chains
/// as [`pairs_panel_fma`]), streamed in groups of [`decode_group`] panels.
#[inline(always)]
pub(crate) unsafe fn pairs_panels_fma<S: Simd>(
    s: S,
    xs: &[&[u32]],
    panels: &[&[bf16]],
    (j0, j1, n): (usize, usize, usize),
    acc: &mut [f32],
) {
    let ap = acc.as_mut_ptr();
    let mut p0 = 0;
    while p0 < panels.len() {
        let np = decode_group::<S>(xs.len(), panels.len() - p0);
        let a = ap.add(p0 * PANEL);
        macro_rules! block {
            ($mt:literal, $p:literal) => {{
                let x: [*const u32; $mt] = core::array::from_fn(|t| xs[t].as_ptr());
                let pp: [*const bf16; $p] = core::array::from_fn(|p| panels[p0 + p].as_ptr());
                pairs_panels_block::<S, $mt, $p>(s, x, pp, (j0, j1, n), a)
            }};
        }
        by_tokens_panels!((xs.len(), np), block);
        p0 += np;
    }
}

/// `out[j]` = `x[2j]`, `x[2j + 1]` rounded to bf16 and packed ([`Simd::round_pairs`]; a
/// missing last odd element is 0). `out` is `x.len().div_ceil(2)` long.
#[inline(always)]
pub(crate) unsafe fn round_pairs_row<S: Simd>(s: S, x: &[f32], out: &mut [u32]) {
    let l = S::LANES;
    let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
    let mut j = 0;
    while 2 * (j + l) <= x.len() {
        s.round_pairs(xp.add(2 * j), op.add(j));
        j += l;
    }
    for (j, o) in out.iter_mut().enumerate().skip(j) {
        *o = round_pair(x[2 * j], x.get(2 * j + 1).copied().unwrap_or(0.0));
    }
}

/// f32 per piece of [`read_sum`]: 256 bytes, four cache lines.
pub(crate) const READ_PIECE: usize = 64;

/// The sum of `data`, read as `streams` far-apart regions interleaved piece by piece (the
/// access pattern of a projection streaming several weight rows), with `loads`, four
/// independent accumulators and, when `prefetch`, a software prefetch 1 KiB ahead in each
/// stream: a read-bandwidth probe, not a numerically careful sum. With
/// [`ReadLoads::Bf16`] the bytes are read as bf16 values (each f32 as its two halves).
#[inline(always)]
pub(crate) unsafe fn read_sum<S: Simd>(
    s: S,
    data: &[f32],
    streams: usize,
    prefetch: bool,
    loads: ReadLoads,
) -> f32 {
    let streams = streams.max(1);
    match loads {
        ReadLoads::Widest => {
            let load = |p: *const f32| s.load(p);
            let (sum, done) = read_streams(s, data.as_ptr(), data.len(), streams, prefetch, load);
            sum + data[done..].iter().sum::<f32>()
        }
        ReadLoads::Bf16 => {
            let halves: &[u16] = bytemuck::cast_slice(data);
            let load = |p: *const bf16| s.load_bf16(p);
            let p = halves.as_ptr() as *const bf16; // bf16 is a u16 (repr(transparent))
            let (sum, done) = read_streams(s, p, halves.len(), streams, prefetch, load);
            sum + halves[done..]
                .iter()
                .map(|&h| bf16::from_bits(h).to_f32())
                .sum::<f32>()
        }
    }
}

/// [`read_sum`]'s loop over `len` elements at `p`, `LANES` of them per `load`: returns the
/// sum and how many elements it read (whole pieces of every stream; the caller adds the rest).
#[inline(always)]
unsafe fn read_streams<S: Simd, T>(
    s: S,
    p: *const T,
    len: usize,
    streams: usize,
    prefetch: bool,
    load: impl Fn(*const T) -> S::F,
) -> (f32, usize) {
    let l = S::LANES;
    // A piece is 256 bytes whatever the element size.
    let piece = READ_PIECE * 4 / core::mem::size_of::<T>();
    let region = len / streams / piece * piece;
    let mut acc = [s.splat(0.0); 4];
    for off in (0..region).step_by(piece) {
        for j in 0..streams {
            let q = p.add(j * region + off);
            if prefetch {
                // Never faults, so an address past the end is harmless (wrapping: no UB).
                s.prefetch(q.wrapping_add(4 * piece) as *const f32);
            }
            for v in (0..piece).step_by(4 * l) {
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = s.add(*a, load(q.add(v + u * l)));
                }
            }
        }
    }
    let a = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
    (s.reduce_sum(a), streams * region)
}

/// The FMA peak probe: `3/4` of the registers as independent `x ← x·m + a` chains (enough to
/// cover the FMA latency on every pipe), `iters` rounds. Returns (FMAs done, a value to keep
/// the work alive).
#[inline(always)]
pub(crate) fn fma_peak<S: Simd>(s: S, iters: usize) -> (usize, f32) {
    let m = s.splat(core::hint::black_box(0.999_999));
    let a = s.splat(core::hint::black_box(1e-7));
    let (chains, total) = peak_chains(s, iters, s.splat(1.0), |x| s.mul_add(x, m, a));
    (iters * chains * S::LANES, total)
}

/// The bf16 dot-product peak probe: [`peak_chains`] of
/// `acc ← acc + a.odd·b.odd + a.even·b.even` ([`Simd::dot_pairs`], `vdpbf16ps` where the ISA
/// has it). Returns (multiply-adds done, two per lane and step; a value to keep the work
/// alive).
#[inline(always)]
pub(crate) unsafe fn dot_pairs_peak<S: Simd>(s: S, iters: usize) -> (usize, f32) {
    let row = [bf16::from_f32(core::hint::black_box(1e-3)); MAX_LANES];
    let a = s.load_pairs(row.as_ptr(), row.as_ptr());
    let (chains, total) = peak_chains(s, iters, s.splat(0.0), |acc| s.dot_pairs(acc, a, a));
    (iters * chains * 2 * S::LANES, total)
}

/// A peak probe's loop: `3/4` of the registers as independent chains `x ← step(x)` from
/// `start` (enough to cover the latency on every pipe), `iters` rounds. Returns the number of
/// chains and the sum of every lane of every chain (to keep the work alive).
#[inline(always)]
fn peak_chains<S: Simd>(
    s: S,
    iters: usize,
    start: S::F,
    step: impl Fn(S::F) -> S::F,
) -> (usize, f32) {
    let chains = S::REGISTERS * 3 / 4;
    let mut acc = [start; 24];
    for _ in 0..iters {
        for v in acc.iter_mut().take(chains) {
            *v = step(*v);
        }
    }
    let mut total = s.splat(0.0);
    for v in acc.iter().take(chains) {
        total = s.add(total, *v);
    }
    (chains, s.reduce_sum(total))
}

/// Most taps the vector short conv takes (Kimi's convs have 4); wider ones run the reference.
pub(crate) const MAX_TAPS: usize = 8;

/// The short causal depthwise conv + SiLU of `ops::conv` (same contract: `x` `[T, d]` raw in,
/// activated out, in place; `weight` `[d, W]`; `state` `[d, W−1]` oldest first, replaced by
/// the stream's last `W−1` raw inputs), `LANES` channels at a time. Each output is the chain
/// `Σ_i w[c,i]·s[t−(W−1)+i]` in order of `i`, then `x / (1 + e^{−x})`, as the reference.
#[inline(always)]
pub(crate) unsafe fn short_conv<S: Simd>(
    s: S,
    x: &mut [f32],
    d: usize,
    weight: crate::weights::Data<'_>,
    state: &mut [f32],
) {
    let (l, w) = (S::LANES, weight.len() / d);
    let (hist, t_len, xp) = (w - 1, x.len() / d, x.as_mut_ptr());
    if t_len == 1 {
        use crate::weights::Data;
        // One token (decode): the weights read in their own type, no per-element dispatch.
        match weight {
            Data::F32(ws) => return conv_token(s, x, ws, state),
            Data::Bf16(ws) => return conv_token(s, x, ws, state),
            _ => {}
        }
    }
    let mut c0 = 0;
    while c0 < d {
        let nc = (d - c0).min(l);
        // Tap-major weights and time-major history of the block's channels.
        let mut taps = [[0.0f32; MAX_LANES]; MAX_TAPS];
        let mut old = [[0.0f32; MAX_LANES]; MAX_TAPS];
        for ci in 0..nc {
            let c = c0 + ci;
            for (i, t) in taps.iter_mut().enumerate().take(w) {
                t[ci] = weight.at(c * w + i);
            }
            for (j, o) in old.iter_mut().enumerate().take(hist) {
                o[ci] = state[c * hist + j];
            }
        }
        // The new history (the stream's last `hist` raw entries), before x is overwritten.
        let mut new = [[0.0f32; MAX_LANES]; MAX_TAPS];
        for (j, n) in new.iter_mut().enumerate().take(hist) {
            let pos = (t_len + j) as isize - hist as isize;
            for (ci, v) in n.iter_mut().enumerate().take(nc) {
                *v = match usize::try_from(pos) {
                    Ok(p) => *xp.add(p * d + c0 + ci),
                    Err(_) => old[(hist as isize + pos) as usize][ci],
                };
            }
        }
        let mut tv = [s.splat(0.0); MAX_TAPS];
        for (v, t) in tv.iter_mut().zip(&taps).take(w) {
            *v = s.load(t.as_ptr());
        }
        // Descending t: output t overwrites raw t only after every later output has read it.
        for t in (0..t_len).rev() {
            let mut acc = s.splat(0.0);
            for (i, tap) in tv.iter().enumerate().take(w) {
                let v = match usize::try_from((t + i) as isize - hist as isize) {
                    Ok(j) => load_upto(s, xp.add(j * d + c0), nc),
                    Err(_) => s.load(old[t + i].as_ptr()),
                };
                acc = s.mul_add(*tap, v, acc);
            }
            store_upto(s, xp.add(t * d + c0), nc, silu(s, acc));
        }
        for (ci, c) in (c0..c0 + nc).enumerate() {
            for (j, n) in new.iter().enumerate().take(hist) {
                state[c * hist + j] = n[ci];
            }
        }
        c0 += nc;
    }
}

/// [`short_conv`] for one token (`x` `[d]`), `LANES` channels at a time: the same chain per
/// output (`Σ_i w[c,i]·s_i` in order of `i`, the token last), the history shifted by one in
/// place. With `LANES` taps, a block's taps and history come from one tile load each (its
/// rows are the channels); otherwise they are gathered one value at a time.
#[inline(always)]
unsafe fn conv_token<S: Simd, W: Elem>(s: S, x: &mut [f32], weight: &[W], state: &mut [f32]) {
    let (l, d) = (S::LANES, x.len());
    let w = weight.len() / d;
    let hist = w - 1;
    let (xp, wp, sp) = (x.as_mut_ptr(), weight.as_ptr(), state.as_mut_ptr());
    let mut c0 = 0;
    while c0 < d {
        let nc = (d - c0).min(l);
        let xv = load_upto(s, xp.add(c0), nc);
        // A history tile reads one value past the block's last row: only before the last block.
        let acc = if w == l && nc == l && c0 + l < d {
            let wr: [*const W; MAX_LANES] =
                core::array::from_fn(|i| wp.add((c0 + i.min(l - 1)) * w));
            let sr: [*const f32; MAX_LANES] =
                core::array::from_fn(|i| sp.add((c0 + i.min(l - 1)) * hist) as *const f32);
            let (wt, st) = (s.load_tile(&wr, 0), s.load_tile(&sr, 0));
            let mut acc = s.splat(0.0);
            for i in 0..S::LANES {
                let v = if i < S::LANES - 1 {
                    s.tile_col(&st, i)
                } else {
                    xv
                };
                acc = s.mul_add(s.tile_col(&wt, i), v, acc);
            }
            acc
        } else {
            conv_gathered(s, (wp, w), sp, (c0, nc), xv)
        };
        shift_history(sp, (c0, nc), hist, xp);
        store_upto(s, xp.add(c0), nc, silu(s, acc));
        c0 += nc;
    }
}

/// One block's conv chain with its taps and history gathered one value at a time.
#[inline(always)]
unsafe fn conv_gathered<S: Simd, W: Elem>(
    s: S,
    (wp, w): (*const W, usize),
    sp: *const f32,
    (c0, nc): (usize, usize),
    xv: S::F,
) -> S::F {
    let hist = w - 1;
    let mut buf = [0.0f32; MAX_LANES];
    let mut acc = s.splat(0.0);
    for i in 0..w {
        for (ci, b) in buf.iter_mut().enumerate().take(nc) {
            *b = (*wp.add((c0 + ci) * w + i)).widen();
        }
        let tap = s.load(buf.as_ptr());
        let v = if i < hist {
            for (ci, b) in buf.iter_mut().enumerate().take(nc) {
                *b = *sp.add((c0 + ci) * hist + i);
            }
            s.load(buf.as_ptr())
        } else {
            xv
        };
        acc = s.mul_add(tap, v, acc);
    }
    acc
}

/// The histories `[hist]` of channels `c0..c0 + nc` (rows of `state`) shifted by one, the
/// channel's input `x[c]` appended.
#[inline(always)]
unsafe fn shift_history(state: *mut f32, (c0, nc): (usize, usize), hist: usize, x: *const f32) {
    for c in c0..c0 + nc {
        let row = state.add(c * hist);
        if hist == 3 {
            // Kimi's 4-tap convs, without a loop.
            *row = *row.add(1);
            *row.add(1) = *row.add(2);
            *row.add(2) = *x.add(c);
        } else if hist > 0 {
            for j in 1..hist {
                *row.add(j - 1) = *row.add(j);
            }
            *row.add(hist - 1) = *x.add(c);
        }
    }
}

/// Defines, in the invoking module, one entry point per kernel for the token `$token`
/// (an expression making it), each with `#[target_feature(enable = $features)]` when given.
/// Their contract is that of the kernels: lengths checked by the caller, and the CPU has the
/// features.
macro_rules! instantiate {
    ($token:expr $(, $features:literal)?) => {
        #[allow(unused_imports)]
        use $crate::simd::kernels as k;

        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
            k::axpy($token, a, x, y)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn decay_predict(s: &mut [f32], decay: f32, kd: f32, p: &mut [f32]) {
            k::decay_predict($token, s, decay, kd, p)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn decay_predict_rows(
            s: (Option<&[f32]>, &mut [f32]),
            kd: &[f32],
            decay: &[f32],
            p: &mut [f32],
        ) {
            k::decay_predict_rows($token, s, kd, decay, p)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn write_read_rows(
            s: &mut [f32],
            kd: &[f32],
            delta: &[f32],
            q: (&[f32], f32),
            o: &mut [f32],
        ) {
            k::write_read_rows($token, s, kd, delta, q, o)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn exp_in_place(x: &mut [f32]) {
            k::exp_in_place($token, x)
        }

        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn sigmoid_scaled(x: &mut [f32], c: f32) {
            k::sigmoid_scaled($token, x, c)
        }

        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn softplus_scaled(x: &mut [f32], c: f32) {
            k::softplus_scaled($token, x, c)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn gemm_acc(m: usize, n: usize, g: &k::Gemm) {
            k::gemm_acc($token, m, n, g)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn short_gemm(k: usize, n: usize) -> bool {
            k::short_gemm($token, k, n)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn tame_rows(t: &k::Tame) -> bool {
            k::tame_rows($token, t)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn transpose(
            shape: (usize, usize),
            src: (&[f32], usize),
            dst: (&mut [f32], usize),
            scaled: Option<(&mut [f32], &[f32])>,
        ) {
            k::transpose($token, shape, src, dst, scaled)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn pack_panel<W: $crate::simd::vector::Elem>(ws: &[&[W]], k0: usize, k1: usize, panel: &mut [f32]) {
            k::pack_panel($token, ws, k0, k1, panel)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn panel_fma<W: $crate::simd::vector::Elem>(
            xs: &[&[f32]],
            steps: (usize, usize),
            panels: &[&[W]],
            acc: (&mut [f32], usize),
            ahead: &[&[W]],
        ) {
            k::panel_fma($token, xs, steps, panels, acc, ahead)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn rows_fma<W: $crate::simd::vector::Elem>(
            xs: &[&[f32]],
            ws: &[&[W]],
            k0: usize,
            k1: usize,
            acc: &mut [f32],
        ) {
            k::rows_fma($token, xs, ws, k0, k1, acc)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn short_conv(
            x: &mut [f32],
            d: usize,
            weight: $crate::weights::Data<'_>,
            state: &mut [f32],
        ) -> bool {
            k::short_conv($token, x, d, weight, state);
            true
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn fma_peak(iters: usize) -> (usize, f32) {
            k::fma_peak($token, iters)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn dot_pairs_peak(iters: usize) -> (usize, f32) {
            k::dot_pairs_peak($token, iters)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn read_sum(
            data: &[f32],
            streams: usize,
            prefetch: bool,
            loads: $crate::simd::ReadLoads,
        ) -> f32 {
            k::read_sum($token, data, streams, prefetch, loads)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn panels_fma(
            xs: &[&[f32]],
            panels: &[&[half::bf16]],
            k0: usize,
            k1: usize,
            acc: &mut [f32],
        ) {
            k::panels_fma($token, xs, panels, k0, k1, acc)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn pairs_panel_fma(
            xs: &[&[u32]],
            steps: (usize, usize, usize),
            panels: &[&[half::bf16]],
            acc: (&mut [f32], usize),
            ahead: &[&[half::bf16]],
        ) {
            k::pairs_panel_fma($token, xs, steps, panels, acc, ahead)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn pairs_panels_fma(
            xs: &[&[u32]],
            panels: &[&[half::bf16]],
            steps: (usize, usize, usize),
            acc: &mut [f32],
        ) {
            k::pairs_panels_fma($token, xs, panels, steps, acc)
        }
        $(#[target_feature(enable = $features)])?
        pub(crate) unsafe fn round_pairs_row(x: &[f32], out: &mut [u32]) {
            k::round_pairs_row($token, x, out)
        }
    };
}
pub(crate) use instantiate;

#[cfg(test)]
mod tests {
    use super::even_blocks;

    #[test]
    fn even_blocks_cover_in_order_and_differ_by_at_most_one() {
        for most in 1..=13 {
            for n in 0..=100 {
                let blocks: std::vec::Vec<(usize, usize)> = even_blocks(n, most).collect();
                assert_eq!(blocks.len(), n.div_ceil(most));
                let mut next = 0;
                for &(start, len) in &blocks {
                    assert_eq!(start, next, "n={n} most={most}");
                    assert!(len >= 1 && len <= most, "n={n} most={most}");
                    next += len;
                }
                assert_eq!(next, n);
                let lens = blocks.iter().map(|b| b.1);
                let (lo, hi) = (lens.clone().min(), lens.max());
                assert!(hi.zip(lo).is_none_or(|(h, l)| h - l <= 1));
            }
        }
        // The prefill's 256 tokens in 12-token blocks: 14 of 12, then 8 of 11.
        let lens: std::vec::Vec<usize> = even_blocks(256, 12).map(|b| b.1).collect();
        assert_eq!(lens, [[12; 14].as_slice(), &[11; 8]].concat());
    }
}
