//! aarch64 Advanced SIMD (NEON): the [`Simd`] mapping (4 lanes, 32 registers), over which the
//! kernel files make their entry points (`simd::instantiate!`). NEON is part of every aarch64
//! target (Linux, Apple), so there is nothing to detect.

use core::arch::aarch64::*;

use half::bf16;

use super::vector::{split_broadcast, split_dot, split_load, split_pair_ops, Elem, Simd, Split};

/// Proof that the CPU has NEON (every aarch64 CPU).
#[derive(Clone, Copy)]
pub(crate) struct Neon(());

impl Neon {
    /// # Safety
    /// The CPU has NEON (true of every aarch64 target this crate builds for).
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Neon {
        Neon(())
    }
}

// SAFETY (every method): NEON is present (the token); pointer validity is the caller's
// contract, stated on the trait.
impl Simd for Neon {
    type F = float32x4_t;
    type Tile = [float32x4_t; 4];
    type P = Split<float32x4_t>;
    const LANES: usize = 4;
    // 6 tokens × 4 vectors = 24 accumulators + 4 panel vectors + 1 broadcast ≤ 32 registers.
    const PANEL_TOKENS: usize = 6;
    const GEMM_ROWS: usize = 6;
    const GEMM_VECS: usize = 4;
    const DECODE_ROWS: usize = 8;
    const REGISTERS: usize = 32;
    const LANE_FMA: bool = true;

    #[inline(always)]
    fn splat(self, x: f32) -> float32x4_t {
        unsafe { vdupq_n_f32(x) }
    }
    #[inline(always)]
    fn add(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vaddq_f32(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vsubq_f32(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vmulq_f32(a, b) }
    }
    #[inline(always)]
    fn div(self, a: float32x4_t, b: float32x4_t) -> float32x4_t {
        unsafe { vdivq_f32(a, b) }
    }
    #[inline(always)]
    fn mul_add(self, a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        unsafe { vfmaq_f32(c, a, b) }
    }
    #[inline(always)]
    fn mul_add_lane<const J: i32>(
        self,
        a: float32x4_t,
        b: float32x4_t,
        c: float32x4_t,
    ) -> float32x4_t {
        unsafe { vfmaq_laneq_f32::<J>(c, b, a) }
    }
    #[inline(always)]
    fn clamp(self, x: float32x4_t, lo: f32, hi: f32) -> float32x4_t {
        // FMAX / FMIN return NaN when either operand is NaN.
        unsafe { vminq_f32(vmaxq_f32(x, vdupq_n_f32(lo)), vdupq_n_f32(hi)) }
    }
    #[inline(always)]
    fn round(self, x: float32x4_t) -> float32x4_t {
        unsafe { vrndnq_f32(x) }
    }
    #[inline(always)]
    fn pow2i(self, n: float32x4_t) -> float32x4_t {
        unsafe {
            let e = vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127));
            vreinterpretq_f32_s32(vshlq_n_s32::<23>(e))
        }
    }
    #[inline(always)]
    fn zero_below(self, x: float32x4_t, limit: f32, v: float32x4_t) -> float32x4_t {
        unsafe {
            let below = vcltq_f32(x, vdupq_n_f32(limit));
            vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(v), below))
        }
    }
    #[inline(always)]
    fn reduce_sum(self, v: float32x4_t) -> f32 {
        unsafe { vaddvq_f32(v) }
    }
    #[inline(always)]
    fn prefetch(self, p: *const f32) {
        // PRFM only hints the cache and never faults, whatever the address.
        unsafe {
            core::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
        }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> float32x4_t {
        vld1q_f32(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: float32x4_t) {
        vst1q_f32(p, v)
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> float32x4_t {
        // A bf16 is the high half of an f32: widen by a 16-bit left shift.
        vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p as *const u16)))
    }
    #[inline(always)]
    unsafe fn load_bf16_pair(self, p: *const bf16) -> (float32x4_t, float32x4_t) {
        let u = vld1q_u16(p as *const u16);
        let lo = vshll_n_u16::<16>(vget_low_u16(u));
        (
            vreinterpretq_f32_u32(lo),
            vreinterpretq_f32_u32(vshll_high_n_u16::<16>(u)),
        )
    }
    #[inline(always)]
    unsafe fn broadcast(self, p: *const f32) -> float32x4_t {
        vld1q_dup_f32(p)
    }
    #[inline(always)]
    unsafe fn load_tile<W: Elem>(self, rows: &[*const W], k: usize) -> [float32x4_t; 4] {
        let (r0, r1) = (W::load(self, rows[0].add(k)), W::load(self, rows[1].add(k)));
        let (r2, r3) = (W::load(self, rows[2].add(k)), W::load(self, rows[3].add(k)));
        // Pairs of lanes, then pairs of pairs.
        let (t0, t1) = (vtrn1q_f32(r0, r1), vtrn2q_f32(r0, r1));
        let (t2, t3) = (vtrn1q_f32(r2, r3), vtrn2q_f32(r2, r3));
        let d = vreinterpretq_f64_f32;
        let f = vreinterpretq_f32_f64;
        [
            f(vtrn1q_f64(d(t0), d(t2))),
            f(vtrn1q_f64(d(t1), d(t3))),
            f(vtrn2q_f64(d(t0), d(t2))),
            f(vtrn2q_f64(d(t1), d(t3))),
        ]
    }
    split_pair_ops!(float32x4_t);
    #[inline(always)]
    fn tile_col(self, tile: &[float32x4_t; 4], j: usize) -> float32x4_t {
        tile[j]
    }
}
