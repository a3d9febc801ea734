//! Scalar activations in f32, on `libm` so they behave the same with and without std.
//!
//! Each mirrors the PyTorch formula the reference uses, so results agree to rounding. With the
//! opt-in feature `micromath`, `exp`, `log1p` and `sqrt` come from the `micromath` crate
//! instead (faster, less accurate: see `fastmath.rs`).

#[cfg(feature = "micromath")]
use crate::fastmath::{expf, log1pf, sqrtf};
#[cfg(not(feature = "micromath"))]
use libm::{expf, log1pf, sqrtf};

/// `e^x`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    expf(x)
}

/// `1 / (1 + e^-x)`, as `torch.sigmoid`. Saturates to exactly 0 or 1 for large |x|.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + expf(-x))
}

/// `x · sigmoid(x)` (SiLU / swish).
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(-x))
}

/// `ln(1 + e^x)`, returning `x` itself above 20 (torch's default `threshold`).
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        log1pf(expf(x))
    }
}

/// `1 / sqrt(x)`.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    1.0 / sqrtf(x)
}

/// A bf16 value widened to f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
pub(crate) fn bf16_to_f32(v: half::bf16) -> f32 {
    f32::from_bits((v.to_bits() as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_matches_definition_and_threshold() {
        for &x in &[-30.0f32, -3.0, 0.0, 0.5, 19.9, 20.0, 20.1, 50.0] {
            let want = if x > 20.0 {
                x as f64
            } else {
                (x as f64).exp().ln_1p()
            };
            assert!(((softplus(x) as f64) - want).abs() <= 1e-6 * want.abs().max(1e-30));
        }
    }

    #[test]
    fn sigmoid_saturates_without_nan() {
        assert_eq!(sigmoid(-200.0), 0.0);
        assert_eq!(sigmoid(200.0), 1.0);
        assert!(sigmoid(f32::NAN).is_nan());
        assert_eq!(silu(-200.0), -0.0);
    }
}
