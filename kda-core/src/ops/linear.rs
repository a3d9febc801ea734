//! Projections: `out[t, o] = Σ_i x[t, i] · W[o, i]` with `W` in checkpoint layout `[out, in]`.
//!
//! Accumulation is in f32 with eight independent partial sums (a fixed order, so every call
//! with the same inputs gives bitwise the same answer, and the compiler vectorises the loop).

use half::{bf16, f16};

use crate::error::{check_len, KdaError};
use crate::weights::{Data, MatRef};

const LANES: usize = 8;

#[inline(always)]
fn reduce(acc: [f32; LANES]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// Dot product with a widening load: `Σ x[i] · widen(w[i])`.
#[inline(always)]
fn dot_with<W: Copy>(x: &[f32], w: &[W], widen: impl Fn(W) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let xc = x.chunks_exact(LANES);
    let wc = w.chunks_exact(LANES);
    let (xr, wr) = (xc.remainder(), wc.remainder());
    for (xs, ws) in xc.zip(wc) {
        for l in 0..LANES {
            acc[l] += xs[l] * widen(ws[l]);
        }
    }
    for (l, (a, b)) in xr.iter().zip(wr.iter()).enumerate() {
        acc[l] += a * widen(*b);
    }
    reduce(acc)
}

/// `Σ x[i]·w[i]` in f32 (lengths must match; the shorter one bounds the sum).
#[inline]
pub fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    dot_with(x, w, |v| v)
}

#[inline(always)]
fn bf16_to_f32(v: bf16) -> f32 {
    f32::from_bits((v.to_bits() as u32) << 16)
}

/// `Σ x[i]·w[i]` with bf16 `w` widened exactly to f32.
#[inline]
pub fn dot_bf16(x: &[f32], w: &[bf16]) -> f32 {
    dot_with(x, w, bf16_to_f32)
}

/// `Σ x[i]·w[i]` with f16 `w` widened exactly to f32.
#[inline]
pub fn dot_f16(x: &[f32], w: &[f16]) -> f32 {
    dot_with(x, w, f16::to_f32)
}

/// `Σ x[i]·w[i]` for any storage format of `w`.
#[inline]
pub fn dot(x: &[f32], w: Data<'_>) -> f32 {
    match w {
        Data::F32(w) => dot_f32(x, w),
        Data::Bf16(w) => dot_bf16(x, w),
        Data::F16(w) => dot_f16(x, w),
    }
}

/// `out = x · Wᵀ` for `rows` input rows: `x` is `[rows, W.cols]`, `out` is `[rows, W.rows]`.
pub fn linear(x: &[f32], w: &MatRef<'_>, out: &mut [f32]) -> Result<(), KdaError> {
    let (n_out, n_in) = (w.rows(), w.cols());
    if n_in == 0 {
        // A zero-width input gives all-zero outputs; only `out` must be a whole number of rows.
        if n_out != 0 && out.len() % n_out != 0 {
            return Err(KdaError::Length {
                arg: "linear out",
                expected: out.len() - out.len() % n_out,
                actual: out.len(),
            });
        }
        out.fill(0.0);
        return Ok(());
    }
    if x.len() % n_in != 0 {
        return Err(KdaError::Length {
            arg: "linear x",
            expected: x.len() - x.len() % n_in,
            actual: x.len(),
        });
    }
    let rows = x.len() / n_in;
    check_len("linear out", out.len(), rows * n_out)?;
    for o in 0..n_out {
        let wr = w.row(o);
        for (t, xr) in x.chunks_exact(n_in).enumerate() {
            out[t * n_out + o] = dot(xr, wr);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn linear_matches_f64_reference_for_every_format() {
        let mut s = 7u64;
        let (rows, n_in, n_out) = (3, 37, 5);
        let x: std::vec::Vec<f32> = (0..rows * n_in).map(|_| lcg(&mut s)).collect();
        let wf: std::vec::Vec<f32> = (0..n_out * n_in).map(|_| lcg(&mut s)).collect();
        let wb: std::vec::Vec<bf16> = wf.iter().map(|&v| bf16::from_f32(v)).collect();
        let wh: std::vec::Vec<f16> = wf.iter().map(|&v| f16::from_f32(v)).collect();
        for data in [Data::F32(&wf), Data::Bf16(&wb), Data::F16(&wh)] {
            let m = MatRef::new("w", data, n_out, n_in).unwrap();
            let mut out = std::vec![0.0f32; rows * n_out];
            linear(&x, &m, &mut out).unwrap();
            for t in 0..rows {
                for o in 0..n_out {
                    let want: f64 = (0..n_in)
                        .map(|i| x[t * n_in + i] as f64 * data.get(o * n_in + i).unwrap() as f64)
                        .sum();
                    assert!((out[t * n_out + o] as f64 - want).abs() < 1e-5, "{t} {o}");
                }
            }
        }
    }

    #[test]
    fn linear_rejects_ragged_input() {
        let w = [0.0f32; 6];
        let m = MatRef::new("w", Data::F32(&w), 2, 3).unwrap();
        let mut out = [0.0f32; 2];
        assert!(matches!(
            linear(&[1.0; 4], &m, &mut out),
            Err(KdaError::Length {
                arg: "linear x",
                ..
            })
        ));
        assert!(matches!(
            linear(&[1.0; 6], &m, &mut out),
            Err(KdaError::Length {
                arg: "linear out",
                ..
            })
        ));
    }
}
