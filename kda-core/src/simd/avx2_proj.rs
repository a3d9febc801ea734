//! AVX2 + FMA projection kernels: every output is one FMA chain over the reduction in order
//! (`acc = fma(x[k], w[k], acc)` for k = 0, 1, …), the order BLAS micro-kernels use, so the
//! packed GEMM (prefill) and the direct row kernel (decode) give bitwise the same values.
//!
//! Same contract as `avx2.rs`: the safe wrappers in `simd/mod.rs` have checked every length
//! and that the CPU has AVX2 and FMA.

use core::arch::x86_64::*;

use half::bf16;

use super::avx2::{load_bf16, transpose8};
use super::{DIRECT, PANEL};

/// A weight element type the kernels can load 8 at a time.
pub(super) trait Lanes: Copy {
    /// 8 elements at `p` widened to f32.
    unsafe fn load8(p: *const Self) -> __m256;
    /// One element widened to f32.
    fn widen(self) -> f32;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Lanes for bf16 {
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        load_bf16(p)
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        super::portable::bf16_to_f32(self)
    }
}

/// Row pointers of a tile, the last row repeated to fill `N`.
#[inline(always)]
fn row_ptrs<W, const N: usize>(ws: &[&[W]]) -> [*const W; N] {
    core::array::from_fn(|r| ws[r.min(ws.len() - 1)].as_ptr())
}

/// Column `k` of the 8 rows at `rp` as one vector.
#[inline(always)]
unsafe fn column<W: Lanes>(rp: &[*const W], k: usize) -> __m256 {
    let v: [f32; 8] = core::array::from_fn(|i| (*rp[i].add(k)).widen());
    _mm256_loadu_ps(v.as_ptr())
}

/// `panel[(k − k0)·16 + r] = W[r][k]` for `k0 ≤ k < k1`: 8×8 blocks transposed in registers
/// (bf16 widened on the way), a column at a time for the last `(k1 − k0) % 8`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn pack_panel<W: Lanes>(ws: &[&[W]], k0: usize, k1: usize, panel: &mut [f32]) {
    let rp: [*const W; PANEL] = row_ptrs(ws);
    let pp = panel.as_mut_ptr();
    let mut k = k0;
    while k + 8 <= k1 {
        for g in 0..2 {
            let cols = transpose8(core::array::from_fn(|i| W::load8(rp[8 * g + i].add(k))));
            for (j, c) in cols.iter().enumerate() {
                _mm256_storeu_ps(pp.add((k - k0 + j) * PANEL + 8 * g), *c);
            }
        }
        k += 8;
    }
    while k < k1 {
        for g in 0..2 {
            _mm256_storeu_ps(pp.add((k - k0) * PANEL + 8 * g), column(&rp[8 * g..], k));
        }
        k += 1;
    }
}

/// `MT` tokens × 16 outputs: the register block of the packed GEMM (12 accumulators, two
/// panel loads and one broadcast per step at `MT` = 6).
#[inline(always)]
unsafe fn panel_block<W: Lanes, const MT: usize>(
    x: [*const f32; MT],
    kc: usize,
    panel: *const W,
    acc: *mut f32,
) {
    let mut a = [[_mm256_setzero_ps(); 2]; MT];
    for (t, a) in a.iter_mut().enumerate() {
        a[0] = _mm256_loadu_ps(acc.add(t * PANEL));
        a[1] = _mm256_loadu_ps(acc.add(t * PANEL + 8));
    }
    // A macro, not a closure: closures do not inherit `target_feature`, and the intrinsics
    // would become calls.
    macro_rules! step {
        ($p:expr) => {{
            let p = $p;
            let b0 = W::load8(panel.add(p * PANEL));
            let b1 = W::load8(panel.add(p * PANEL + 8));
            for (t, a) in a.iter_mut().enumerate() {
                let xv = _mm256_broadcast_ss(&*x[t].add(p));
                a[0] = _mm256_fmadd_ps(xv, b0, a[0]);
                a[1] = _mm256_fmadd_ps(xv, b1, a[1]);
            }
        }};
    }
    // Not unrolled: unrolling makes the compiler hoist later panel loads and spill.
    for p in 0..kc {
        step!(p);
    }
    for (t, a) in a.iter().enumerate() {
        _mm256_storeu_ps(acc.add(t * PANEL), a[0]);
        _mm256_storeu_ps(acc.add(t * PANEL + 8), a[1]);
    }
}

/// Continues `acc[t·16 + r]` over `k0..k1` from a packed panel (f32, or bf16 in the panel
/// layout, widened as it is loaded), tokens in blocks of 6.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn panel_fma<W: Lanes>(
    xs: &[&[f32]],
    k0: usize,
    k1: usize,
    panel: &[W],
    acc: &mut [f32],
) {
    let (pp, ap) = (panel.as_ptr(), acc.as_mut_ptr());
    let kc = k1 - k0;
    for (g, xg) in xs.chunks(6).enumerate() {
        let a = ap.add(g * 6 * PANEL);
        macro_rules! block {
            ($mt:literal) => {{
                let x: [*const f32; $mt] = core::array::from_fn(|t| xg[t].as_ptr().add(k0));
                panel_block::<W, $mt>(x, kc, pp, a)
            }};
        }
        match xg.len() {
            6 => block!(6),
            5 => block!(5),
            4 => block!(4),
            3 => block!(3),
            2 => block!(2),
            _ => block!(1),
        }
    }
}

/// `MT` tokens × 8·`G` rows straight from the row-major weights: each 8×8 block is transposed
/// in registers and consumed at once (no packing: for decode, where nothing would reuse it).
#[inline(always)]
unsafe fn rows_block<W: Lanes, const MT: usize, const G: usize>(
    x: [*const f32; MT],
    rp: &[*const W],
    k0: usize,
    k1: usize,
    acc: *mut f32,
) {
    let mut a = [[_mm256_setzero_ps(); G]; MT];
    for (t, a) in a.iter_mut().enumerate() {
        for (g, a) in a.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(acc.add(t * DIRECT + 8 * g));
        }
    }
    let mut k = k0;
    while k + 8 <= k1 {
        for g in 0..G {
            let cols = transpose8(core::array::from_fn(|i| W::load8(rp[8 * g + i].add(k))));
            for (j, c) in cols.iter().enumerate() {
                for t in 0..MT {
                    let xv = _mm256_broadcast_ss(&*x[t].add(k + j));
                    a[t][g] = _mm256_fmadd_ps(xv, *c, a[t][g]);
                }
            }
        }
        k += 8;
    }
    while k < k1 {
        for g in 0..G {
            let c = column(&rp[8 * g..], k);
            for t in 0..MT {
                let xv = _mm256_broadcast_ss(&*x[t].add(k));
                a[t][g] = _mm256_fmadd_ps(xv, c, a[t][g]);
            }
        }
        k += 1;
    }
    for (t, a) in a.iter().enumerate() {
        for (g, a) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.add(t * DIRECT + 8 * g), *a);
        }
    }
}

/// Continues `acc[t·32 + r]` over `k0..k1` straight from up to 32 weight rows. One token
/// (decode) goes 8 rows at a time: 8 weight streams suit the prefetchers best (16 and 32
/// measured slower), at the price of one FMA chain in flight. More tokens go 16 rows × up to
/// 4 tokens at a time.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows_fma<W: Lanes>(
    xs: &[&[f32]],
    ws: &[&[W]],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    let rp: [*const W; DIRECT] = row_ptrs(ws);
    let ap = acc.as_mut_ptr();
    let groups = ws.len().div_ceil(8);
    if xs.len() == 1 {
        let x = [xs[0].as_ptr()];
        for g in 0..groups {
            rows_block::<W, 1, 1>(x, &rp[8 * g..], k0, k1, ap.add(8 * g));
        }
        return;
    }
    for half in 0..groups.div_ceil(2) {
        let two = groups > 2 * half + 1;
        let rh = &rp[16 * half..];
        for (g, xg) in xs.chunks(4).enumerate() {
            let a = ap.add(g * 4 * DIRECT + 16 * half);
            macro_rules! block {
                ($mt:literal) => {{
                    let x: [*const f32; $mt] = core::array::from_fn(|t| xg[t].as_ptr());
                    if two {
                        rows_block::<W, $mt, 2>(x, rh, k0, k1, a)
                    } else {
                        rows_block::<W, $mt, 1>(x, rh, k0, k1, a)
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
/// `(k, r)` of panel `p` at `pp[p] + 16k + r`): per step one 32-byte load per panel, widened,
/// and two FMAs per token and panel. `acc` rows are `4·PANEL` apart per token.
#[inline(always)]
unsafe fn panels_block<const MT: usize, const P: usize>(
    x: [*const f32; MT],
    pp: [*const bf16; P],
    k0: usize,
    k1: usize,
    acc: *mut f32,
) {
    let mut a = [[[_mm256_setzero_ps(); 2]; P]; MT];
    for (t, a) in a.iter_mut().enumerate() {
        for (p, a) in a.iter_mut().enumerate() {
            for (v, a) in a.iter_mut().enumerate() {
                *a = _mm256_loadu_ps(acc.add(t * 4 * PANEL + p * PANEL + 8 * v));
            }
        }
    }
    for k in k0..k1 {
        let xv: [__m256; MT] = core::array::from_fn(|t| _mm256_broadcast_ss(&*x[t].add(k)));
        for (p, pp) in pp.iter().enumerate() {
            let lo = load_bf16(pp.add(k * PANEL));
            let hi = load_bf16(pp.add(k * PANEL + 8));
            for (t, xv) in xv.iter().enumerate() {
                a[t][p][0] = _mm256_fmadd_ps(*xv, lo, a[t][p][0]);
                a[t][p][1] = _mm256_fmadd_ps(*xv, hi, a[t][p][1]);
            }
        }
    }
    for (t, a) in a.iter().enumerate() {
        for (p, a) in a.iter().enumerate() {
            for (v, a) in a.iter().enumerate() {
                _mm256_storeu_ps(acc.add(t * 4 * PANEL + p * PANEL + 8 * v), *a);
            }
        }
    }
}

/// Continues `acc[t·64 + 16p + r]` over `k0..k1` for up to 4 tokens × up to 4 panels: one
/// token takes all panels at once (8 FMA chains, 4 weight streams), more tokens fewer.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn panels_fma(
    xs: &[&[f32]],
    panels: &[&[bf16]],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) {
    let ap = acc.as_mut_ptr();
    let per = match xs.len() {
        1 => 4,
        2 => 2,
        _ => 1,
    };
    let mut p0 = 0;
    while p0 < panels.len() {
        let np = (panels.len() - p0).min(per);
        let a = ap.add(p0 * PANEL);
        macro_rules! block {
            ($mt:literal, $p:literal) => {{
                let x: [*const f32; $mt] = core::array::from_fn(|t| xs[t].as_ptr());
                let pp: [*const bf16; $p] = core::array::from_fn(|p| panels[p0 + p].as_ptr());
                panels_block::<$mt, $p>(x, pp, k0, k1, a)
            }};
        }
        match (xs.len(), np) {
            (1, 4) => block!(1, 4),
            (1, 3) => block!(1, 3),
            (1, 2) => block!(1, 2),
            (1, _) => block!(1, 1),
            (2, 2) => block!(2, 2),
            (2, _) => block!(2, 1),
            (3, _) => block!(3, 1),
            _ => block!(4, 1),
        }
        p0 += np;
    }
}
