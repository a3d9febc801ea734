//! x86-64 AVX-512F: the [`Simd`] mapping (16 lanes, 32 registers), over which the kernel
//! files make their entry points (`simd::instantiate!`), and the CPUID check of the cores
//! that split each 512-bit FMA in two (Zen 4), which some block sizes follow. Every AVX-512F
//! CPU also has AVX2 and FMA; the 16×16 tile transpose is four rounds of 512-bit shuffles.
//!
//! Two tokens share the mapping: `Avx512<false>` (AVX-512F) and `Avx512<true>` (also
//! AVX512BW and AVX512_BF16), whose bf16 pair operations are `vpermw`, `vdpbf16ps` and
//! `vcvtne2ps2bf16`; without them the same pair operations are emulated on 32-bit lanes. The
//! f32 operations are the same instructions on both.

use core::arch::x86_64::*;

use half::bf16;

use super::vector::{round_pairs_scalar, Elem, Simd};

/// Proof that the CPU has AVX-512F, AVX2 and FMA, and with `BF16` also AVX512BW and
/// AVX512_BF16.
#[derive(Clone, Copy)]
pub(crate) struct Avx512<const BF16: bool>(());

impl<const BF16: bool> Avx512<BF16> {
    /// # Safety
    /// The CPU has AVX-512F, AVX2 and FMA, and with `BF16` also AVX512BW and AVX512_BF16.
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Avx512<BF16> {
        Avx512(())
    }
}

/// The even (low 16 bits) and odd (high 16 bits) bf16 of each 32-bit lane of `v`, widened.
#[inline(always)]
unsafe fn split_pairs(v: __m512i) -> (__m512, __m512) {
    let even = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
    let odd = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(-65536)));
    (even, odd)
}

/// `vpermw` indices interleaving the low and the high 256 bits of a vector by 16-bit words.
#[inline(always)]
unsafe fn interleave_index() -> __m512i {
    _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4,
        19, 3, 18, 2, 17, 1, 16, 0,
    )
}

/// The 16×16 transpose of `r` (row `i` in `r[i]`; column `j` in the result's `j`): pairs of
/// rows interleaved, then 4×4 blocks within each 128-bit lane, then 128-bit lanes across
/// groups of rows 4 apart and 8 apart. 64 shuffles of whole vectors (the four 8×8 quarters
/// through AVX2 and their joins took 112 and were slower: PERFORMANCE.md, 2026-12-05, af6b3e6).
#[inline(always)]
unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    // Lane `4L + m` of `t[2i]`/`t[2i + 1]`: rows 2i, 2i+1 of columns 4L + {0, 1} / {2, 3}.
    let t: [__m512; 16] = core::array::from_fn(|n| {
        let (a, b) = (r[n & !1], r[n | 1]);
        if n % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    // `u[4i + m]`, each 128-bit lane `L`: rows 4i..4i+4 of column 4L + m.
    let u: [__m512; 16] = core::array::from_fn(|n| {
        let (i, m) = (n / 4, n % 4);
        let (a, c) = (t[4 * i + m / 2], t[4 * i + 2 + m / 2]);
        if m % 2 == 0 {
            _mm512_shuffle_ps::<0x44>(a, c)
        } else {
            _mm512_shuffle_ps::<0xEE>(a, c)
        }
    });
    // 128-bit lanes 0, 2 (then 1, 3) of `u[i]` and `u[i + 4]`, for rows 0–7 and 8–15.
    let v: [__m512; 16] = core::array::from_fn(|n| {
        let (half, odd, i) = (n / 8, (n / 4) % 2, n % 4);
        let (a, b) = (u[8 * half + i], u[8 * half + 4 + i]);
        if odd == 0 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    core::array::from_fn(|j| {
        let (a, b) = (v[j % 8], v[8 + j % 8]);
        if j < 8 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    })
}

// SAFETY (every method): an `Avx512` exists only where the CPU has AVX-512F, AVX2 and FMA
// (and, for `Avx512<true>`, AVX512BW and AVX512_BF16, the only features the `BF16` branches
// use); pointer validity is the caller's contract, stated on the trait.
impl<const BF16: bool> Simd for Avx512<BF16> {
    type F = __m512;
    type Tile = [__m512; 16];
    type P = __m512i;
    const LANES: usize = 16;
    const PANEL_TOKENS: usize = 12;
    const PREFILL_PANELS: usize = 2;
    const GEMM_ROWS: usize = 12;
    const GEMM_VECS: usize = 2;
    const DECODE_ROWS: usize = 16;
    const REGISTERS: usize = 32;

    #[inline(always)]
    fn prefill_panels(self) -> usize {
        if split_512_bit_fma() {
            1
        } else {
            Self::PREFILL_PANELS
        }
    }

    #[inline(always)]
    fn split_fma_gemms(self) -> bool {
        split_512_bit_fma()
    }

    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn mul_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn clamp(self, x: __m512, lo: f32, hi: f32) -> __m512 {
        // max/min return their second operand when either is NaN: x second keeps a NaN.
        unsafe { _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), x)) }
    }
    #[inline(always)]
    fn round(self, x: __m512) -> __m512 {
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x) }
    }
    #[inline(always)]
    fn pow2i(self, n: __m512) -> __m512 {
        unsafe {
            let e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
        }
    }
    #[inline(always)]
    fn zero_below(self, x: __m512, limit: f32, v: __m512) -> __m512 {
        unsafe {
            let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(limit));
            _mm512_maskz_mov_ps(!below, v)
        }
    }
    #[inline(always)]
    fn reduce_sum(self, v: __m512) -> f32 {
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn prefetch(self, p: *const f32) {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> __m512 {
        let h = _mm256_loadu_si256(p as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
    #[inline(always)]
    unsafe fn broadcast(self, p: *const f32) -> __m512 {
        _mm512_set1_ps(*p)
    }
    #[inline(always)]
    unsafe fn load_tile<W: Elem>(self, rows: &[*const W], k: usize) -> [__m512; 16] {
        transpose16(core::array::from_fn(|i| W::load(self, rows[i].add(k))))
    }
    #[inline(always)]
    fn tile_col(self, tile: &[__m512; 16], j: usize) -> __m512 {
        tile[j]
    }
    #[inline(always)]
    unsafe fn load_pairs(self, lo: *const bf16, hi: *const bf16) -> __m512i {
        if BF16 {
            // Two consecutive panel rows (the common case) are one 64-byte load.
            let both = if hi == lo.add(16) {
                _mm512_loadu_si512(lo as *const __m512i)
            } else {
                let l = _mm256_loadu_si256(lo as *const __m256i);
                let h = _mm256_loadu_si256(hi as *const __m256i);
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l), h)
            };
            _mm512_permutexvar_epi16(interleave_index(), both)
        } else {
            let l = _mm256_loadu_si256(lo as *const __m256i);
            let h = _mm256_loadu_si256(hi as *const __m256i);
            let h = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
            _mm512_or_si512(_mm512_cvtepu16_epi32(l), h)
        }
    }
    #[inline(always)]
    unsafe fn broadcast_pair(self, p: *const u32) -> __m512i {
        _mm512_set1_epi32(*p as i32)
    }
    #[inline(always)]
    fn dot_pairs(self, acc: __m512, a: __m512i, b: __m512i) -> __m512 {
        unsafe {
            if BF16 {
                // SAFETY: both types are 64 bytes of plain data (32 bf16 either way).
                let bh = |v: __m512i| core::mem::transmute::<__m512i, __m512bh>(v);
                _mm512_dpbf16_ps(acc, bh(a), bh(b))
            } else {
                let ((ae, ao), (be, bo)) = (split_pairs(a), split_pairs(b));
                _mm512_fmadd_ps(ae, be, _mm512_fmadd_ps(ao, bo, acc))
            }
        }
    }
    #[inline(always)]
    unsafe fn round_pairs(self, x: *const f32, out: *mut u32) {
        if BF16 {
            let (lo, hi) = (_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(16)));
            // SAFETY: both types are 64 bytes of plain data (32 bf16 either way).
            let v = core::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_storeu_si512(out as *mut __m512i, v)
        } else {
            round_pairs_scalar(16, x, out)
        }
    }
}

/// Whether this CPU runs each 512-bit FMA as two 256-bit halves: AMD family 19h (Zen 4; Zen 3,
/// the same family, has no AVX-512). Read once with CPUID and kept; on other x86-64 CPUs (Zen 5,
/// Intel) false.
fn split_512_bit_fma() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    // 0: not read yet, 1: no, 2: yes.
    static SPLIT: AtomicU8 = AtomicU8::new(0);
    match SPLIT.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let split = amd_family() == Some(0x19);
            SPLIT.store(if split { 2 } else { 1 }, Ordering::Relaxed);
            split
        }
    }
}

/// The CPU family (CPUID leaf 1, with the extended family) on an AMD CPU; `None` elsewhere.
fn amd_family() -> Option<u32> {
    // SAFETY: CPUID leaves 0 and 1 exist on every x86-64 CPU (`__cpuid` is a safe function
    // in newer Rust, hence the `allow`).
    #[allow(unused_unsafe)]
    let (vendor, signature) = unsafe {
        let v = core::arch::x86_64::__cpuid(0);
        ([v.ebx, v.edx, v.ecx], core::arch::x86_64::__cpuid(1).eax)
    };
    // "AuthenticAMD" as CPUID returns it.
    if vendor != [0x6874_7541, 0x6974_6e65, 0x444d_4163] {
        return None;
    }
    let base = (signature >> 8) & 0xf;
    Some(if base == 0xf {
        base + ((signature >> 20) & 0xff)
    } else {
        base
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPUID's vendor and family, as read by [`amd_family`], agree with what Linux reports.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn amd_family_matches_proc_cpuinfo() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            println!("skipped: no /proc/cpuinfo");
            return;
        };
        let field = |name: &str| {
            info.lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(name))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        };
        let family: Option<u32> = field("cpu family").and_then(|f| f.parse().ok());
        let amd = field("vendor_id").as_deref() == Some("AuthenticAMD");
        assert_eq!(amd_family(), family.filter(|_| amd));
        assert_eq!(split_512_bit_fma(), amd && family == Some(0x19));
    }
}
