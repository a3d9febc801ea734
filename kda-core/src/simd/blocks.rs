//! Products with GGUF `Q8_0` blocks (an f16 scale `d` and 32 int8 quants `q`), the weights
//! dequantised in registers: the safe wrapper, its kernel and its tests.
//!
//! Each weight is `d·q` rounded to f32, the value dequantisation gives; the products are summed
//! in one chain per vector of a block (two on AVX-512, four on AVX2, eight on NEON), then the
//! chains added in a fixed order. That order is the kernel's own: within a few ulp of
//! `ops::linear::dot_blocks` (dequantise, then eight partial sums), not bitwise.

use super::types::{Q8_0_BYTES, Q8_0_ELEMS};
use super::{dispatch, portable, Path};

/// `Σ x[i]·w[i]` over the `Q8_0` blocks `w` (`x.len() / 32` of them): `None` unless `x.len()`
/// is a whole number of blocks and `w` exactly their bytes.
#[inline]
pub fn dot_q8_0(isa: impl Into<Path>, x: &[f32], w: &[u8]) -> Option<f32> {
    if !x.len().is_multiple_of(Q8_0_ELEMS) || w.len() != x.len() / Q8_0_ELEMS * Q8_0_BYTES {
        return None;
    }
    Some(dispatch!(isa, dot_q8_0(x, w), portable::dot_q8_0(x, w)))
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use crate::simd::types::{Q8_0_BYTES, Q8_0_ELEMS};
    use crate::simd::vector::Simd;

    /// Most vectors in one block (32 weights over 4 lanes).
    const MAX_VECTORS: usize = 8;

    /// [`super::dot_q8_0`]. Contract: `x.len()` is a whole number of blocks and `w` holds
    /// exactly their bytes; `S::LANES` divides 32 and is at least 4.
    #[inline(always)]
    pub(crate) unsafe fn dot_q8_0<S: Simd>(s: S, x: &[f32], w: &[u8]) -> f32 {
        let vectors = Q8_0_ELEMS / S::LANES;
        let mut acc = [s.splat(0.0); MAX_VECTORS];
        let mut q = [0.0f32; Q8_0_ELEMS];
        for (b, block) in w.chunks_exact(Q8_0_BYTES).enumerate() {
            let d =
                s.splat(half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32());
            // Widened in a plain loop: inlined into the ISA's entry point, it compiles to
            // its sign-extending loads and conversions, and stays in L1.
            for (v, &byte) in q.iter_mut().zip(&block[2..]) {
                *v = byte as i8 as f32;
            }
            let xb = x.as_ptr().add(b * Q8_0_ELEMS);
            for (j, a) in acc.iter_mut().enumerate().take(vectors) {
                let wq = s.mul(d, s.load(q.as_ptr().add(j * S::LANES)));
                *a = s.mul_add(wq, s.load(xb.add(j * S::LANES)), *a);
            }
        }
        let mut sum = acc[0];
        for a in &acc[1..vectors] {
            sum = s.add(sum, *a);
        }
        s.reduce_sum(sum)
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn dot_q8_0(x: &[f32], w: &[u8]) -> f32 {
                $crate::simd::blocks::kernels::dot_q8_0($token, x, w)
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

    /// Blocks with scales from the f16 range's edges (0, subnormal, negative, large) and
    /// quants from −128 to 127.
    fn blocks(n: usize, seed: u32) -> Vec<u8> {
        let scales = [
            0x0000u16, 0x0001, 0x3c00, 0xbc00, 0x2e66, 0x7bff, 0x1400, 0x8400,
        ];
        let q = rnd(n * Q8_0_ELEMS, seed);
        let mut out = Vec::with_capacity(n * Q8_0_BYTES);
        for b in 0..n {
            out.extend_from_slice(&scales[(b + seed as usize) % scales.len()].to_le_bytes());
            for i in 0..Q8_0_ELEMS {
                out.push(((q[b * Q8_0_ELEMS + i] * 128.0) as i32).clamp(-128, 127) as i8 as u8);
            }
        }
        out
    }

    /// Every path against the dequantise-then-sum reference (f64): within `4e-7` of `Σ|x·w|`;
    /// the portable path is that reference's summation in f32 (the same bound).
    #[test]
    fn q8_0_products_match_the_dequantised_sum() {
        for n in [1usize, 2, 7, 64, 72] {
            let w = blocks(n, n as u32);
            let x: Vec<f32> = rnd(n * Q8_0_ELEMS, 99 + n as u32)
                .iter()
                .map(|v| v * 3.0)
                .collect();
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for (b, block) in w.chunks_exact(Q8_0_BYTES).enumerate() {
                let d = half::f16::from_bits(u16::from_le_bytes([block[0], block[1]])).to_f32();
                for i in 0..Q8_0_ELEMS {
                    let wv = d * (block[2 + i] as i8 as f32);
                    let p = x[b * Q8_0_ELEMS + i] as f64 * wv as f64;
                    want += p;
                    mag += p.abs();
                }
            }
            for path in core::iter::once(Path::Reference).chain(test_paths()) {
                let got = dot_q8_0(path, &x, &w).unwrap() as f64;
                assert!(
                    (got - want).abs() <= 4e-7 * mag + 1e-30,
                    "{path:?} n {n}: {got} vs {want} (Σ|x·w| {mag})"
                );
            }
        }
    }

    #[test]
    fn q8_0_lengths_are_checked() {
        let w = blocks(2, 1);
        let x = rnd(64, 2);
        for path in core::iter::once(Path::Reference).chain(test_paths()) {
            assert!(dot_q8_0(path, &x[..63], &w).is_none());
            assert!(dot_q8_0(path, &x, &w[..67]).is_none());
            assert!(dot_q8_0(path, &x[..32], &w).is_none());
            assert!(dot_q8_0(path, &[], &[]) == Some(0.0));
        }
    }
}
