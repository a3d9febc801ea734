//! The vector abstraction every SIMD kernel is written over (candle / pulp style, our own
//! trait rather than a dependency; see ARCHITECTURE.md for why).
//!
//! An instruction set is a zero-sized *token* type implementing [`Simd`]. A token can only be
//! made where the CPU has the instruction set (its constructor is `unsafe`), so the trait's
//! arithmetic is safe to call; loads and stores take raw pointers and are `unsafe`. Kernels
//! (the `kernels` module of each kernel file) are generic over the token and
//! `#[inline(always)]`; each kernel file instantiates them for every token inside one
//! `#[target_feature]` function per kernel (`simd::instantiate!`), where everything inlines
//! into straight vector code.
//!
//! What an ISA provides is deliberately small: width, load/store (f32 and widened bf16),
//! add/mul/fused multiply-add, clamp, round, 2ⁿ, a flush, a horizontal sum and a
//! `LANES × LANES` tile load that transposes in registers. `exp` is written once here
//! ([`exp_poly`]) from those operations.

use half::bf16;

/// One instruction set's vector of `LANES` f32 values and the operations the kernels use.
///
/// Every arithmetic operation works lane by lane; `mul_add` is fused on ISAs with FMA and a
/// multiply followed by an add on the portable instantiation, which is the only difference
/// between them besides [`Simd::exp`].
pub(crate) trait Simd: Copy {
    /// A vector of [`Simd::LANES`] f32.
    type F: Copy;
    /// `LANES` vectors holding a `LANES × LANES` block (see [`Simd::load_tile`]).
    type Tile: Copy;
    /// `LANES` pairs of bf16, the operands of [`Simd::dot_pairs`]: one `2·LANES`-element
    /// vector where the ISA has a bf16 dot product (`vdpbf16ps`), else [`Split`] f32 vectors.
    type P: Copy;
    /// f32 lanes per vector (4, 8 or 16).
    const LANES: usize;
    /// Tokens per block of the packed projection GEMM (`panel_fma`): chosen so the
    /// accumulators and the panel loads fit the ISA's registers.
    const PANEL_TOKENS: usize;
    /// Panels of 16 outputs per register block of the packed projection GEMMs (`panel_fma`,
    /// `pairs_panel_fma`): 1, or 2 where each broadcast input then feeds two panels' vectors
    /// (AVX-512: `PANEL_TOKENS` × 2 accumulators of the 32 registers, half the loads per
    /// multiply-add, which a core with two full-width 512-bit FMA pipes needs; PERFORMANCE.md,
    /// 2026-12-03, Zen 5, 6046202).
    const PREFILL_PANELS: usize = 1;
    /// Rows per block of the small dense GEMM (`gemm_acc`): 6 or 12.
    const GEMM_ROWS: usize;
    /// Vectors per row of a block of the small dense GEMM: 2 or 4.
    const GEMM_VECS: usize;
    /// Weight rows streamed at once by one-token decode (`rows_fma`).
    const DECODE_ROWS: usize;
    /// Vector registers of the ISA.
    const REGISTERS: usize;
    /// Whether [`Simd::mul_add_lane`] is one instruction (NEON's by-element FMA; only with
    /// `LANES == 4`). Kernels that multiply by one scalar at a time then load four scalars as
    /// one vector and use its lanes, instead of broadcasting each scalar from memory.
    const LANE_FMA: bool = false;
    /// Whether the packed GEMM reads a bf16 panel row by parity ([`Simd::load_bf16_parity`],
    /// its accumulators split the same way): fewer operations per widened vector where
    /// widening in order takes a shuffle and a shift per vector (AVX2).
    const BF16_PARITY: bool = false;

    /// [`Simd::PREFILL_PANELS`] on the CPU this runs on: the AVX-512 paths take 1 on a core
    /// that runs each 512-bit FMA as two 256-bit halves (AMD Zen 4), where one panel per block
    /// was measured 9 % faster than two (PERFORMANCE.md, 2026-12-04, 40d0a13).
    #[inline(always)]
    fn prefill_panels(self) -> usize {
        Self::PREFILL_PANELS
    }

    /// Whether the GEMMs take the shapes measured best on a core that splits 512-bit FMAs
    /// (AMD Zen 4; true on the AVX-512 paths there): a short reduction (the chunked form's
    /// state update) in blocks of 4 rows × 4 vectors, row blocks outer, instead of the usual
    /// column panels (the update 16 % faster), and every register block summing its products
    /// from zero and adding `C`'s start value at the end, instead of starting its chains from
    /// `C` (6 % of that; PERFORMANCE.md, 2026-12-04, 3940b65). Elsewhere unmeasured, so left
    /// as it was. The late start changes the rounding, not the accuracy.
    #[inline(always)]
    fn split_fma_gemms(self) -> bool {
        false
    }

    /// `x` in every lane.
    fn splat(self, x: f32) -> Self::F;
    /// `a + b`.
    fn add(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a − b`.
    fn sub(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a · b`.
    fn mul(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a / b` (correctly rounded on every path).
    fn div(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c` (fused where the ISA has FMA).
    fn mul_add(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `min(hi, max(lo, x))`, with a NaN in `x` kept.
    fn clamp(self, x: Self::F, lo: f32, hi: f32) -> Self::F;
    /// Rounds to the nearest integer, ties to even.
    fn round(self, x: Self::F) -> Self::F;
    /// `2ⁿ` for integral `n` in `[−127, 127]` (`n = −127` gives 0).
    fn pow2i(self, n: Self::F) -> Self::F;
    /// `v`, with 0 in the lanes where `x < limit` (an ordered compare: NaN lanes keep `v`).
    fn zero_below(self, x: Self::F, limit: f32, v: Self::F) -> Self::F;
    /// The sum of the lanes (a fixed order per ISA).
    fn reduce_sum(self, v: Self::F) -> f32;

    /// `a[J] · b + c`: lane `J < 4` of `a` times every lane of `b`, fused like
    /// [`Simd::mul_add`] (so equal to `mul_add(splat(a[J]), b, c)` bit for bit). Kernels use
    /// it only where [`Simd::LANE_FMA`]; the default goes through memory.
    #[inline(always)]
    fn mul_add_lane<const J: i32>(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        let mut buf = [0.0f32; MAX_LANES];
        // SAFETY: `buf` holds MAX_LANES ≥ LANES f32.
        unsafe { self.store(buf.as_mut_ptr(), a) };
        self.mul_add(self.splat(buf[J as usize]), b, c)
    }

    /// Hints the CPU to fetch the cache line at `p` (never faults; a no-op by default).
    #[inline(always)]
    fn prefetch(self, p: *const f32) {
        let _ = p;
    }

    /// `LANES` f32 at `p`.
    ///
    /// # Safety
    /// `p` is valid for reading `LANES` f32.
    unsafe fn load(self, p: *const f32) -> Self::F;
    /// Stores `v` at `p`.
    ///
    /// # Safety
    /// `p` is valid for writing `LANES` f32.
    unsafe fn store(self, p: *mut f32, v: Self::F);
    /// `LANES` bf16 at `p`, widened to f32.
    ///
    /// # Safety
    /// `p` is valid for reading `LANES` bf16.
    unsafe fn load_bf16(self, p: *const bf16) -> Self::F;
    /// `2·LANES` bf16 at `p`, widened: the first `LANES`, then the next `LANES` (NEON: one
    /// 16-byte load and two widening shifts).
    ///
    /// # Safety
    /// `p` is valid for reading `2·LANES` bf16.
    #[inline(always)]
    unsafe fn load_bf16_pair(self, p: *const bf16) -> (Self::F, Self::F) {
        (self.load_bf16(p), self.load_bf16(p.add(Self::LANES)))
    }
    /// `2·LANES` bf16 at `p`, widened and split by parity: (elements 0, 2, 4, …; elements 1, 3,
    /// 5, …). AVX2: one load, then a shift for the even elements (the low halves of 32-bit
    /// words) and a mask for the odd ones.
    ///
    /// # Safety
    /// `p` is valid for reading `2·LANES` bf16.
    #[inline(always)]
    unsafe fn load_bf16_parity(self, p: *const bf16) -> (Self::F, Self::F) {
        let (mut even, mut odd) = ([0.0f32; MAX_LANES], [0.0f32; MAX_LANES]);
        for i in 0..Self::LANES {
            even[i] = crate::math::bf16_to_f32(*p.add(2 * i));
            odd[i] = crate::math::bf16_to_f32(*p.add(2 * i + 1));
        }
        (self.load(even.as_ptr()), self.load(odd.as_ptr()))
    }
    /// `2·LANES` f32 in order (`a`, then `b`) split by parity, as [`Simd::load_bf16_parity`]
    /// splits bf16.
    #[inline(always)]
    fn deinterleave(self, a: Self::F, b: Self::F) -> (Self::F, Self::F) {
        let mut x = [0.0f32; 2 * MAX_LANES];
        // SAFETY: `x` holds 2·MAX_LANES ≥ 2·LANES f32.
        unsafe {
            self.store(x.as_mut_ptr(), a);
            self.store(x.as_mut_ptr().add(Self::LANES), b);
        }
        let (mut even, mut odd) = ([0.0f32; MAX_LANES], [0.0f32; MAX_LANES]);
        for i in 0..Self::LANES {
            (even[i], odd[i]) = (x[2 * i], x[2 * i + 1]);
        }
        // SAFETY: `even` and `odd` hold MAX_LANES ≥ LANES f32.
        unsafe { (self.load(even.as_ptr()), self.load(odd.as_ptr())) }
    }
    /// The inverse of [`Simd::deinterleave`]: the even and odd elements back in order.
    #[inline(always)]
    fn interleave(self, even: Self::F, odd: Self::F) -> (Self::F, Self::F) {
        let (mut e, mut o) = ([0.0f32; MAX_LANES], [0.0f32; MAX_LANES]);
        let mut x = [0.0f32; 2 * MAX_LANES];
        // SAFETY: every buffer holds at least LANES (`x` 2·LANES) f32.
        unsafe {
            self.store(e.as_mut_ptr(), even);
            self.store(o.as_mut_ptr(), odd);
            for i in 0..Self::LANES {
                (x[2 * i], x[2 * i + 1]) = (e[i], o[i]);
            }
            (
                self.load(x.as_ptr()),
                self.load(x.as_ptr().add(Self::LANES)),
            )
        }
    }
    /// `*p` in every lane.
    ///
    /// # Safety
    /// `p` is valid for reading one f32.
    #[inline(always)]
    unsafe fn broadcast(self, p: *const f32) -> Self::F {
        self.splat(*p)
    }
    /// The first `n < LANES` f32 at `p`, zeros after.
    ///
    /// # Safety
    /// `p` is valid for reading `n` f32.
    #[inline(always)]
    unsafe fn load_partial(self, p: *const f32, n: usize) -> Self::F {
        let mut buf = [0.0f32; MAX_LANES];
        core::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n.min(Self::LANES));
        self.load(buf.as_ptr())
    }
    /// Stores the first `n < LANES` lanes of `v` at `p`.
    ///
    /// # Safety
    /// `p` is valid for writing `n` f32.
    #[inline(always)]
    unsafe fn store_partial(self, p: *mut f32, n: usize, v: Self::F) {
        let mut buf = [0.0f32; MAX_LANES];
        self.store(buf.as_mut_ptr(), v);
        core::ptr::copy_nonoverlapping(buf.as_ptr(), p, n.min(Self::LANES));
    }

    /// Loads `LANES` values from each of the `LANES` rows `rows[i] + k` and transposes them:
    /// column `j` of the result ([`Simd::tile_col`]) holds `rows[i][k + j]` for every `i`.
    ///
    /// # Safety
    /// `rows` has at least `LANES` pointers, each valid for reading `k + LANES` elements.
    unsafe fn load_tile<W: Elem>(self, rows: &[*const W], k: usize) -> Self::Tile;
    /// Column `j < LANES` of a tile.
    fn tile_col(self, tile: &Self::Tile, j: usize) -> Self::F;

    /// Pairs `(lo[i], hi[i])`, `i < LANES`: `lo` the even element of each pair, `hi` the odd.
    ///
    /// # Safety
    /// `lo` and `hi` are each valid for reading `LANES` bf16.
    unsafe fn load_pairs(self, lo: *const bf16, hi: *const bf16) -> Self::P;
    /// The pair at `p` (even element in the low 16 bits, as [`round_pair`] packs it) in every
    /// lane.
    ///
    /// # Safety
    /// `p` is valid for reading one `u32`.
    unsafe fn broadcast_pair(self, p: *const u32) -> Self::P;
    /// `acc + a.odd·b.odd + a.even·b.even` per lane, rounded after each addition, the odd
    /// product first: `vdpbf16ps` (Intel SDM; matched bit for bit on AMD Zen 4 in our tests)
    /// where the ISA has it, else two fused multiply-adds in that order, which is the same
    /// result (a product of two bf16 is exact in f32) except that `vdpbf16ps` flushes
    /// subnormal inputs and results to zero.
    fn dot_pairs(self, acc: Self::F, a: Self::P, b: Self::P) -> Self::F;
    /// Rounds `2·LANES` f32 at `x` to bf16 pairs at `out` (`out[j]` packs `x[2j]`, `x[2j+1]`),
    /// as [`round_pair`] does one pair.
    ///
    /// # Safety
    /// `x` is valid for reading `2·LANES` f32 and `out` for writing `LANES` u32.
    #[inline(always)]
    unsafe fn round_pairs(self, x: *const f32, out: *mut u32) {
        round_pairs_scalar(Self::LANES, x, out)
    }

    /// `e^x` in every lane (the ISAs: [`exp_poly`]; the portable instantiation: `libm`).
    #[inline(always)]
    fn exp(self, x: Self::F) -> Self::F {
        exp_poly(self, x)
    }

    /// [`Simd::exp`] of `W` vectors (the ISAs: [`exp_poly_n`], interleaved).
    #[inline(always)]
    fn exp_n<const W: usize>(self, x: [Self::F; W]) -> [Self::F; W] {
        exp_poly_n(self, x)
    }
}

/// [`Simd::round_pairs`] one pair at a time, for `lanes` pairs.
///
/// # Safety
/// `x` is valid for reading `2·lanes` f32 and `out` for writing `lanes` u32.
#[inline(always)]
pub(crate) unsafe fn round_pairs_scalar(lanes: usize, x: *const f32, out: *mut u32) {
    for j in 0..lanes {
        *out.add(j) = round_pair(*x.add(2 * j), *x.add(2 * j + 1));
    }
}

/// The [`Simd`] pair operations of a mapping without a bf16 dot product: [`Split`] pairs of
/// the mapping's vector type `$f`.
macro_rules! split_pair_ops {
    ($f:ty) => {
        #[inline(always)]
        unsafe fn load_pairs(self, lo: *const bf16, hi: *const bf16) -> Split<$f> {
            split_load(self, lo, hi)
        }
        #[inline(always)]
        unsafe fn broadcast_pair(self, p: *const u32) -> Split<$f> {
            split_broadcast(self, p)
        }
        #[inline(always)]
        fn dot_pairs(self, acc: $f, a: Split<$f>, b: Split<$f>) -> $f {
            split_dot(self, acc, a, b)
        }
    };
}
pub(crate) use split_pair_ops;

/// The emulated [`Simd::P`]: the even and the odd elements of `LANES` bf16 pairs, widened.
#[derive(Clone, Copy)]
pub(crate) struct Split<F> {
    even: F,
    odd: F,
}

/// [`Simd::load_pairs`] for [`Split`] pairs.
///
/// # Safety
/// As [`Simd::load_pairs`].
#[inline(always)]
pub(crate) unsafe fn split_load<S: Simd>(s: S, lo: *const bf16, hi: *const bf16) -> Split<S::F> {
    Split {
        even: s.load_bf16(lo),
        odd: s.load_bf16(hi),
    }
}

/// [`Simd::broadcast_pair`] for [`Split`] pairs.
///
/// # Safety
/// As [`Simd::broadcast_pair`].
#[inline(always)]
pub(crate) unsafe fn split_broadcast<S: Simd>(s: S, p: *const u32) -> Split<S::F> {
    let v = *p;
    Split {
        even: s.splat(f32::from_bits(v << 16)),
        odd: s.splat(f32::from_bits(v & 0xffff_0000)),
    }
}

/// [`Simd::dot_pairs`] for [`Split`] pairs: the odd product, then the even one.
#[inline(always)]
pub(crate) fn split_dot<S: Simd>(s: S, acc: S::F, a: Split<S::F>, b: Split<S::F>) -> S::F {
    s.mul_add(a.even, b.even, s.mul_add(a.odd, b.odd, acc))
}

/// `x` rounded to bf16 as `vcvtneps2bf16` does: to nearest, ties to even; a subnormal input
/// becomes a zero of its sign; NaN stays a (quiet) NaN.
#[inline(always)]
pub(crate) fn round_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    if b & 0x7f80_0000 == 0 {
        return ((b >> 16) & 0x8000) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// `lo` and `hi` rounded to bf16 ([`round_bf16`]) and packed as one pair: `lo` in the low 16
/// bits (the even element), `hi` in the high 16.
#[inline(always)]
pub(crate) fn round_pair(lo: f32, hi: f32) -> u32 {
    round_bf16(lo) as u32 | (round_bf16(hi) as u32) << 16
}

/// The widest vector of any instantiation (AVX-512 and the 16-lane portable one).
pub(crate) const MAX_LANES: usize = 16;

/// A weight element type: f32, or bf16 widened to f32 as it is loaded.
pub(crate) trait Elem: Copy {
    /// Whether the element is bf16 (the kernels may then read it by parity, see
    /// [`Simd::load_bf16_parity`]).
    const BF16: bool = false;
    /// `LANES` elements at `p`, as f32.
    ///
    /// # Safety
    /// `p` is valid for reading `S::LANES` elements.
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::F;
    /// One element as f32.
    fn widen(self) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const f32) -> S::F {
        s.load(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Elem for bf16 {
    const BF16: bool = true;
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const bf16) -> S::F {
        s.load_bf16(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        crate::math::bf16_to_f32(self)
    }
}

/// Column `k` of the first `LANES` rows at `rows` as one vector (the scalar edge of a tile).
///
/// # Safety
/// `rows` has at least `LANES` pointers, each valid for reading `k + 1` elements.
#[inline(always)]
pub(crate) unsafe fn column<S: Simd, W: Elem>(s: S, rows: &[*const W], k: usize) -> S::F {
    let mut buf = [0.0f32; MAX_LANES];
    for (b, r) in buf.iter_mut().zip(&rows[..S::LANES]) {
        *b = (*r.add(k)).widen();
    }
    s.load(buf.as_ptr())
}

/// The first `n` (`1..=LANES`) floats at `p`: a whole load when `n == LANES`.
///
/// # Safety
/// `p` is valid for reading `n` f32.
#[inline(always)]
pub(crate) unsafe fn load_upto<S: Simd>(s: S, p: *const f32, n: usize) -> S::F {
    if n == S::LANES {
        s.load(p)
    } else {
        s.load_partial(p, n)
    }
}

/// Stores the first `n` (`1..=LANES`) lanes of `v` at `p`: a whole store when `n == LANES`.
///
/// # Safety
/// `p` is valid for writing `n` f32.
#[inline(always)]
pub(crate) unsafe fn store_upto<S: Simd>(s: S, p: *mut f32, n: usize, v: S::F) {
    if n == S::LANES {
        s.store(p, v)
    } else {
        s.store_partial(p, n, v)
    }
}

/// `e^x`: `x = n·ln2 + r` with `|r| ≤ ln2/2`, the Cephes degree-6 polynomial in `r`, `2ⁿ`
/// from exponent bits. Within 2 ulp of `libm::expf` up to 88 (above, `x` is clamped to 88);
/// below −87.5 the result is flushed to 0; NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_poly<S: Simd>(s: S, x: S::F) -> S::F {
    exp_poly_n(s, [x])[0]
}

/// [`exp_poly`] of `W` vectors, step by step in lockstep (each vector's bits as
/// [`exp_poly`]'s): written interleaved, so that the vectors' dependency chains (about 15
/// operations deep) overlap in the out-of-order core instead of filling its scheduler with one.
#[inline(always)]
pub(crate) fn exp_poly_n<S: Simd, const W: usize>(s: S, x: [S::F; W]) -> [S::F; W] {
    let (mut n, mut r) = (x, x);
    for i in 0..W {
        let xc = s.clamp(x[i], -88.0, 88.0);
        n[i] = s.round(s.mul(xc, s.splat(core::f32::consts::LOG2_E)));
        // r = x − n·ln2 in two steps (ln2 split into a short head and a tail).
        r[i] = s.mul_add(n[i], s.splat(-0.693_359_4), xc);
    }
    for i in 0..W {
        r[i] = s.mul_add(n[i], s.splat(2.121_944_4e-4), r[i]);
    }
    let mut p = [s.splat(1.987_569_1e-4); W];
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        for i in 0..W {
            p[i] = s.mul_add(p[i], r[i], s.splat(c));
        }
    }
    let mut out = x;
    for i in 0..W {
        let r2 = s.mul(r[i], r[i]);
        let pi = s.mul_add(p[i], r2, s.add(r[i], s.splat(1.0)));
        out[i] = s.zero_below(x[i], -87.5, s.mul(pi, s.pow2i(n[i])));
    }
    out
}
