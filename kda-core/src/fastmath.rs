//! `micromath` replacements for the three `libm` functions behind [`crate::math`] (feature
//! `micromath`, off by default).
//!
//! micromath trades accuracy for speed and size: its `exp`, `ln` and `sqrt` are bit-level
//! approximations (measured on the Cortex-M4F: `exp` within 2.4e-3 relative, `sqrt` within
//! ~4e-2; see `embedded/README.md` for the layer-level error and the instruction counts). There is no `ln_1p`: it is `ln(1 + x)`, which loses
//! everything below 2^−24 relative to 1 (softplus of very negative inputs returns 0 instead of
//! `e^x`).
//!
//! Only [`crate::math`] is routed through here: the vectorised decay `exp` of the SIMD paths
//! (`simd::exp_in_place`) and the chunked kernel's pairwise `exp` still use `libm`.

use micromath::F32Ext;

/// `e^x` (micromath), with the range guarded: micromath builds the result's exponent field
/// directly and wraps (debug builds: panics) outside about ±87, so below that it is 0 (where
/// `e^x` leaves the normal f32 range), above 88 it is `+∞`, and NaN stays NaN.
#[inline(always)]
pub(crate) fn expf(x: f32) -> f32 {
    if x.is_nan() {
        x
    } else if x < -87.0 {
        0.0
    } else if x > 88.0 {
        f32::INFINITY
    } else {
        F32Ext::exp(x)
    }
}

/// `ln(1 + x)` (micromath `ln`).
#[inline(always)]
pub(crate) fn log1pf(x: f32) -> f32 {
    F32Ext::ln(1.0 + x)
}

/// `sqrt(x)` (micromath).
#[inline(always)]
pub(crate) fn sqrtf(x: f32) -> f32 {
    F32Ext::sqrt(x)
}
