//! ggml's float helpers, ported bit for bit for the encoders ([`super::encode`],
//! [`super::encode_k`]): its rounding to the nearest integer, C's float → integer conversion
//! as x86-64 does it, and its f32 → f16 conversion.

use half::f16;
use libm::fabsf;

/// ggml's `nearest_int`: round to nearest, ties to even, by adding 1.5·2²³ and reading the
/// mantissa (meant for `|v| ≤ 2²² − 1`; outside it, the same bits ggml gets).
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// C's `(int32_t)v` on x86-64 (`cvttss2si`): truncation, and `i32::MIN` for NaN or out of range.
#[inline(always)]
pub(crate) fn c_trunc(v: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        v as i32
    } else {
        i32::MIN
    }
}

/// ggml's f32 → f16 (`ggml_compute_fp32_to_fp16`): round to nearest even, overflow to
/// infinity; the bits as stored.
pub(crate) fn fp16_bits(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
    let low = if shl1_w > 0xFF00_0000 {
        0x7E00
    } else {
        nonsign
    };
    ((sign >> 16) | low) as u16
}

/// Stores `f` as ggml's f16 at `b[at..at + 2]` and returns the stored value widened to f32
/// (ggml's `GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(f))`).
#[inline]
pub(crate) fn put_half(b: &mut [u8], at: usize, f: f32) -> f32 {
    let h = fp16_bits(f);
    b[at..at + 2].copy_from_slice(&h.to_le_bytes());
    f16::from_bits(h).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (3.49, 3),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }

    #[test]
    fn c_trunc_is_x86_cvttss2si() {
        assert_eq!(c_trunc(-7.9), -7);
        assert_eq!(c_trunc(f32::INFINITY), i32::MIN);
        assert_eq!(c_trunc(f32::NAN), i32::MIN);
        assert_eq!(c_trunc(3e9), i32::MIN);
        assert_eq!(c_trunc(-2_147_483_648.0), i32::MIN);
    }

    /// ggml's f32 → f16 equals IEEE round-to-nearest-even (the `half` crate) on every finite
    /// f32 with a step through the bit patterns, and on the edges.
    #[test]
    fn fp16_matches_round_to_nearest_even() {
        let edges = [
            0.0, -0.0, 65504.0, 65520.0, 65519.99, 1e-8, 2.98e-8, 5.96e-8, -1e9,
        ];
        let steps = (0..u32::MAX).step_by(65_537).map(f32::from_bits);
        for f in edges.into_iter().chain(steps).filter(|f| f.is_finite()) {
            assert_eq!(fp16_bits(f), f16::from_f32(f).to_bits(), "{f:e}");
        }
        assert_eq!(fp16_bits(f32::INFINITY), 0x7C00);
        assert_eq!(fp16_bits(f32::NAN) & 0x7E00, 0x7E00);
    }
}
