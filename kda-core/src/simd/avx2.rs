//! x86-64 AVX2 + FMA: the [`Simd`] mapping (8 lanes, 16 registers). The kernel files make
//! their entry points over it (`simd::instantiate!`).

use core::arch::x86_64::*;

use half::bf16;

use super::vector::{split_broadcast, split_dot, split_load, split_pair_ops, Elem, Simd, Split};

/// Proof that the CPU has AVX2 and FMA.
#[derive(Clone, Copy)]
pub(crate) struct Avx2(());

impl Avx2 {
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Avx2 {
        Avx2(())
    }
}

/// Transposes an 8×8 block held as 8 row vectors into 8 column vectors (unpack, shuffle,
/// lane permute: 24 shuffles).
#[inline(always)]
unsafe fn transpose8(a: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(a[0], a[1]);
    let t1 = _mm256_unpackhi_ps(a[0], a[1]);
    let t2 = _mm256_unpacklo_ps(a[2], a[3]);
    let t3 = _mm256_unpackhi_ps(a[2], a[3]);
    let t4 = _mm256_unpacklo_ps(a[4], a[5]);
    let t5 = _mm256_unpackhi_ps(a[4], a[5]);
    let t6 = _mm256_unpacklo_ps(a[6], a[7]);
    let t7 = _mm256_unpackhi_ps(a[6], a[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// 8 bf16 at `p` widened to f32 (a bf16 is the high half of an f32).
#[inline(always)]
pub(crate) unsafe fn load_bf16x8(p: *const bf16) -> __m256 {
    let h = _mm_loadu_si128(p as *const __m128i);
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

// SAFETY (every method): an `Avx2` exists only where the CPU has AVX2 and FMA; pointer
// validity is the caller's contract, stated on the trait.
impl Simd for Avx2 {
    type F = __m256;
    type Tile = [__m256; 8];
    type P = Split<__m256>;
    const LANES: usize = 8;
    const PANEL_TOKENS: usize = 6;
    const GEMM_ROWS: usize = 6;
    const GEMM_VECS: usize = 2;
    const DECODE_ROWS: usize = 8;
    const REGISTERS: usize = 16;
    const BF16_PARITY: bool = true;

    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn mul_add(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn clamp(self, x: __m256, lo: f32, hi: f32) -> __m256 {
        // max/min return their second operand when either is NaN: x second keeps a NaN.
        unsafe { _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), x)) }
    }
    #[inline(always)]
    fn round(self, x: __m256) -> __m256 {
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x) }
    }
    #[inline(always)]
    fn pow2i(self, n: __m256) -> __m256 {
        unsafe {
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
        }
    }
    #[inline(always)]
    fn zero_below(self, x: __m256, limit: f32, v: __m256) -> __m256 {
        unsafe { _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(limit)), v) }
    }
    #[inline(always)]
    fn reduce_sum(self, v: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
        }
    }
    #[inline(always)]
    fn prefetch(self, p: *const f32) {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> __m256 {
        load_bf16x8(p)
    }
    #[inline(always)]
    unsafe fn broadcast(self, p: *const f32) -> __m256 {
        _mm256_broadcast_ss(&*p)
    }
    #[inline(always)]
    unsafe fn load_tile<W: Elem>(self, rows: &[*const W], k: usize) -> [__m256; 8] {
        // Written out, not `array::from_fn`: a closure would not inherit the target features.
        let r = |i: usize| rows[i].add(k);
        transpose8([
            W::load(self, r(0)),
            W::load(self, r(1)),
            W::load(self, r(2)),
            W::load(self, r(3)),
            W::load(self, r(4)),
            W::load(self, r(5)),
            W::load(self, r(6)),
            W::load(self, r(7)),
        ])
    }
    #[inline(always)]
    unsafe fn load_bf16_parity(self, p: *const bf16) -> (__m256, __m256) {
        let w = _mm256_loadu_si256(p as *const __m256i);
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w)),
            _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(-0x1_0000))),
        )
    }
    #[inline(always)]
    fn deinterleave(self, a: __m256, b: __m256) -> (__m256, __m256) {
        // Per 128-bit lane: a0 a2 b0 b2 | a4 a6 b4 b6; the 64-bit permute puts them in order.
        unsafe {
            let even = _mm256_shuffle_ps::<0x88>(a, b);
            let odd = _mm256_shuffle_ps::<0xDD>(a, b);
            (
                _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(even))),
                _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(odd))),
            )
        }
    }
    #[inline(always)]
    fn interleave(self, even: __m256, odd: __m256) -> (__m256, __m256) {
        unsafe {
            let lo = _mm256_unpacklo_ps(even, odd);
            let hi = _mm256_unpackhi_ps(even, odd);
            (
                _mm256_permute2f128_ps::<0x20>(lo, hi),
                _mm256_permute2f128_ps::<0x31>(lo, hi),
            )
        }
    }
    split_pair_ops!(__m256);
    #[inline(always)]
    fn tile_col(self, tile: &[__m256; 8], j: usize) -> __m256 {
        tile[j]
    }
}
