//! The portable instantiation of [`Simd`]: `N` plain f32 lanes (`N` = 4, 8 or 16), multiply
//! then add, `libm` for `exp`. It runs the generic kernels at every width an ISA has (NEON 4,
//! AVX2 8, AVX-512 16) on any machine, so their tails, blocking and reductions are tested
//! bitwise against the reference loops of `portable.rs` wherever the tests run.

use half::bf16;

use super::vector::{split_broadcast, split_dot, split_load, split_pair_ops, Elem, Simd, Split};

/// `N` f32 lanes in plain Rust.
#[derive(Clone, Copy)]
pub(crate) struct Lanes<const N: usize>;

impl<const N: usize> Lanes<N> {
    #[inline(always)]
    fn map(a: [f32; N], f: impl Fn(f32) -> f32) -> [f32; N] {
        a.map(f)
    }
    #[inline(always)]
    fn zip(a: [f32; N], b: [f32; N], f: impl Fn(f32, f32) -> f32) -> [f32; N] {
        core::array::from_fn(|i| f(a[i], b[i]))
    }
}

impl<const N: usize> Simd for Lanes<N> {
    type F = [f32; N];
    type Tile = [[f32; N]; N];
    type P = Split<[f32; N]>;
    const LANES: usize = N;
    const PANEL_TOKENS: usize = 6;
    // At AVX-512's width, AVX-512's panels per block (tested on any machine).
    const PREFILL_PANELS: usize = if N >= 16 { 2 } else { 1 };
    const GEMM_ROWS: usize = if N >= 16 { 12 } else { 6 };
    const GEMM_VECS: usize = if N <= 4 { 4 } else { 2 };
    const DECODE_ROWS: usize = if N > 8 { N } else { 8 };
    // At NEON's width, NEON's register count and lane path (so the kernels' NEON-specific
    // blocking is tested on any machine).
    const REGISTERS: usize = if N == 4 { 32 } else { 16 };
    const LANE_FMA: bool = N == 4;
    // So that the parity path of the packed GEMM runs at every width in tests.
    const BF16_PARITY: bool = true;

    // With 32 registers (4 lanes), the GEMM shapes that only Zen 4 takes, so that they are
    // tested on any machine.
    #[inline(always)]
    fn split_fma_gemms(self) -> bool {
        Self::REGISTERS >= 32
    }

    #[inline(always)]
    fn splat(self, x: f32) -> [f32; N] {
        [x; N]
    }
    #[inline(always)]
    fn add(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        Self::zip(a, b, |a, b| a + b)
    }
    #[inline(always)]
    fn sub(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        Self::zip(a, b, |a, b| a - b)
    }
    #[inline(always)]
    fn mul(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        Self::zip(a, b, |a, b| a * b)
    }
    #[inline(always)]
    fn div(self, a: [f32; N], b: [f32; N]) -> [f32; N] {
        Self::zip(a, b, |a, b| a / b)
    }
    #[inline(always)]
    fn mul_add(self, a: [f32; N], b: [f32; N], c: [f32; N]) -> [f32; N] {
        core::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    fn mul_add_lane<const J: i32>(self, a: [f32; N], b: [f32; N], c: [f32; N]) -> [f32; N] {
        let x = a[J as usize];
        core::array::from_fn(|i| x * b[i] + c[i])
    }
    #[inline(always)]
    fn clamp(self, x: [f32; N], lo: f32, hi: f32) -> [f32; N] {
        Self::map(x, |v| if v.is_nan() { v } else { v.max(lo).min(hi) })
    }
    #[inline(always)]
    fn round(self, x: [f32; N]) -> [f32; N] {
        Self::map(x, libm::rintf)
    }
    #[inline(always)]
    fn pow2i(self, n: [f32; N]) -> [f32; N] {
        Self::map(n, |n| f32::from_bits(((n as i32 + 127) as u32) << 23))
    }
    #[inline(always)]
    fn zero_below(self, x: [f32; N], limit: f32, v: [f32; N]) -> [f32; N] {
        Self::zip(x, v, |x, v| if x < limit { 0.0 } else { v })
    }
    #[inline(always)]
    fn reduce_sum(self, v: [f32; N]) -> f32 {
        v.iter().sum()
    }
    #[inline(always)]
    unsafe fn load(self, p: *const f32) -> [f32; N] {
        core::ptr::read_unaligned(p as *const [f32; N])
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32, v: [f32; N]) {
        core::ptr::write_unaligned(p as *mut [f32; N], v)
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const bf16) -> [f32; N] {
        core::array::from_fn(|i| (*p.add(i)).widen())
    }
    #[inline(always)]
    unsafe fn load_tile<W: Elem>(self, rows: &[*const W], k: usize) -> [[f32; N]; N] {
        core::array::from_fn(|j| core::array::from_fn(|i| (*rows[i].add(k + j)).widen()))
    }
    split_pair_ops!([f32; N]);
    #[inline(always)]
    fn tile_col(self, tile: &[[f32; N]; N], j: usize) -> [f32; N] {
        tile[j]
    }
    #[inline(always)]
    fn exp(self, x: [f32; N]) -> [f32; N] {
        Self::map(x, libm::expf)
    }
    #[inline(always)]
    fn exp_n<const W: usize>(self, x: [[f32; N]; W]) -> [[f32; N]; W] {
        x.map(|v| self.exp(v))
    }
}
