//! The q/k L2 norm (spec §3.1) and the sigmoid-gated RMSNorm on the output (§8).

use crate::error::{check_len, rows_of, KdaError};
use crate::math::{rsqrt, sigmoid};
use crate::weights::Data;

/// Rows of `dim` in `len` (`dim` must be at least 1).
fn rows(len: usize, dim: usize, arg: &'static str) -> Result<usize, KdaError> {
    if dim == 0 {
        return Err(KdaError::Length {
            arg,
            expected: 0,
            actual: len,
        });
    }
    rows_of(arg, len, dim)
}

#[inline]
fn sum_sq(x: &[f32]) -> f32 {
    crate::ops::linear::dot_f32(x, x)
}

/// `x ← x / sqrt(Σx² + eps)` for each row of `dim` elements (eps **inside** the sqrt, as fla's
/// kernels; a zero row stays zero).
pub fn l2_norm(x: &mut [f32], dim: usize, eps: f32) -> Result<(), KdaError> {
    rows(x.len(), dim, "l2 norm x")?;
    for row in x.chunks_exact_mut(dim) {
        let r = rsqrt(sum_sq(row) + eps);
        for v in row {
            *v *= r;
        }
    }
    Ok(())
}

/// `o ← o · rsqrt(mean(o²) + eps) · weight · sigmoid(gate)` per row of `dim` elements;
/// `weight` `[dim]` is shared by all rows (heads), `gate` has the shape of `o`.
pub fn gated_rms_norm(
    o: &mut [f32],
    gate: &[f32],
    weight: Data<'_>,
    dim: usize,
    eps: f32,
) -> Result<(), KdaError> {
    rows(o.len(), dim, "gated norm o")?;
    check_len("gated norm gate", gate.len(), o.len())?;
    check_len("o_norm.weight", weight.len(), dim)?;
    for (row, grow) in o.chunks_exact_mut(dim).zip(gate.chunks_exact(dim)) {
        let r = rsqrt(sum_sq(row) / dim as f32 + eps);
        for (i, (v, g)) in row.iter_mut().zip(grow).enumerate() {
            *v = *v * r * weight.at(i) * sigmoid(*g);
        }
    }
    Ok(())
}

/// [`gated_rms_norm`] for one row, writing the result over the gate row, the sigmoid on the
/// vector path `isa` (on the portable path the same numbers as [`gated_rms_norm`]).
#[inline]
pub(crate) fn gated_rms_norm_row_into_gate(
    isa: crate::simd::Isa,
    o: &[f32],
    gate: &mut [f32],
    weight: Data<'_>,
    eps: f32,
) {
    let r = rsqrt(sum_sq(o) / o.len() as f32 + eps);
    crate::simd::sigmoid_scaled(isa, gate, 1.0);
    for (i, (v, g)) in o.iter().zip(gate.iter_mut()).enumerate() {
        *g *= *v * r * weight.at(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l2_norm_keeps_eps_inside_the_sqrt() {
        let mut x = [3.0f32, 4.0, 0.0, 0.0, 1e-4, 0.0];
        l2_norm(&mut x, 2, 1e-6).unwrap();
        assert!((x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6);
        assert_eq!(&x[2..4], &[0.0, 0.0]);
        // A tiny row is NOT scaled to unit length: 1e-4/sqrt(1e-8+1e-6) ≈ 0.0995.
        assert!((x[4] - 0.099_503_72).abs() < 1e-6);
    }

    #[test]
    fn gated_rms_norm_identities() {
        // Gate → +∞ and unit weight: plain RMSNorm; rows have RMS ≈ 1.
        let mut o = [1.0f32, -2.0, 3.0, 0.5, 0.5, 0.5];
        let g = [100.0f32; 6];
        let w = [1.0f32; 3];
        gated_rms_norm(&mut o, &g, Data::F32(&w), 3, 0.0).unwrap();
        for row in o.chunks(3) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 3.0;
            assert!((ms - 1.0).abs() < 1e-5);
        }
        assert!(gated_rms_norm(&mut o, &g[..3], Data::F32(&w), 3, 0.0).is_err());
    }
}
