//! Integer approximations of `exp`, `sigmoid`, `softplus`, `silu`, `1/x` and `1/sqrt(x)`.
//!
//! Every function is pure integer arithmetic (`i32`/`i64` multiplies, shifts and adds: on
//! Armv7-M `SMULL`/`SMLAL`/`UMULL`, no division, no float). Bounds are absolute in the output's
//! format unless stated; each is checked by the tests at the bottom against f64 over the whole
//! input domain (dense grids plus random points).
//!
//! | function | in | out | error bound (tested) |
//! |---|---|---|---|
//! | [`exp_neg_q24`] `e^{−t}` | t ≥ 0, Q7.24 | Q1.30 | 5e-9 (≈ 5 LSB) |
//! | [`recip_q30`] `1/d` | d ∈ [1, 2], Q1.30 | Q1.30 | 2e-9 |
//! | [`sigmoid_q16`] `1/(1+e^{−x})` | Q15.16 | Q1.30 | 5e-9 |
//! | [`silu_q16`] `x·sigmoid(x)` | Q15.16 | Q15.16 | 0.5 LSB + 5e-9·\|x\| |
//! | [`softplus_q16`] `ln(1+e^{x})` (identity above 20, as torch) | Q15.16 | Q7.24, saturating | 4.5e-8 (≈ 0.75 LSB: ½ LSB of rounding + 1.5e-8) |
//! | [`rsqrt_u64`] `1/sqrt(v)` | u64 | mantissa Q1.30 · 2^−k | relative 4e-9 |
//!
//! Method: `e^{−t} = 2^{−n}·2^{−f}` with `t·log2(e) = n + f`, `2^{−f}` a degree-6 Chebyshev fit
//! on `[0, 1)` (fit error 1.9e-9); `ln(1+u)` on `u ∈ [0, 1]` a degree-9 Chebyshev fit (5.6e-9);
//! `1/d` three Newton steps from the linear minimax start `24/17 − 8/17·d` (start error 1/17,
//! then 3.5e-3, 1.2e-5, 1.5e-10); `1/sqrt(u)`, `u ∈ [1, 4)`, three Newton steps from a
//! 24-entry table (start error ≤ 3.2 %, then 1.5e-3, 3.4e-6, 1.7e-11). What is left is the
//! rounding of the Q1.30 intermediates.

/// 1.0 in Q1.30.
pub const ONE_Q30: i32 = 1 << 30;

/// `log2(e)` in Q1.30.
const LOG2E_Q30: i64 = 1_549_082_005;

/// `2^{−f}`, `f ∈ [0, 1)`: Chebyshev fit, monomial coefficients in Q1.30 (c0 first).
const EXP2_NEG: [i64; 7] = [
    1_073_741_824,
    -744_260_975,
    257_938_938,
    -59_583_045,
    10_286_509,
    -1_369_790,
    117_454,
];

/// `ln(1+u)`, `u ∈ [0, 1]`: Chebyshev fit, monomial coefficients in Q1.30 (c0 first).
const LN1P: [i64; 10] = [
    0,
    1_073_740_654,
    -536_830_372,
    357_361_063,
    -264_523_392,
    198_307_750,
    -134_504_003,
    71_417_231,
    -24_737_165,
    4_029_350,
];

/// `round(2^30 / sqrt((i + 8.5) / 8))`: start of the `1/sqrt(u)` Newton steps, indexed by the
/// top five bits of `u ∈ [1, 4)` in Q2.30 (minus 8).
const RSQRT_SEED: [i64; 24] = [
    1_041_682_578,
    985_333_074,
    937_238_702,
    895_562_589,
    858_993_459,
    826_566_842,
    797_555_404,
    771_398_898,
    747_657_839,
    725_981_977,
    706_088_274,
    687_745_184,
    670_761_200,
    654_976_372,
    640_255_922,
    626_485_368,
    613_566_757,
    601_415_717,
    589_959_130,
    579_133_272,
    568_882_316,
    559_157_115,
    549_914_212,
    541_115_017,
];

/// `round(v / 2^s)` for `s ≥ 1` (ties toward +∞).
#[inline(always)]
pub(crate) fn shr_round(v: i64, s: u32) -> i64 {
    (v + (1i64 << (s - 1))) >> s
}

/// `round(a · b / 2^30)`: a Q·.30 product (`b` is normally a Q1.30 factor `|b| ≤ 1`).
#[inline(always)]
pub fn mul_q30(a: i32, b: i32) -> i32 {
    shr_round(a as i64 * b as i64, 30) as i32
}

/// Saturates an i64 into i32.
#[inline(always)]
pub(crate) fn sat32(v: i64) -> i32 {
    v.clamp(i32::MIN as i64, i32::MAX as i64) as i32
}

/// Horner evaluation of a Q1.30 polynomial at `x` (Q1.30, `0 ≤ x ≤ 1`), in i64.
#[inline(always)]
fn horner(c: &[i64], x: i64) -> i64 {
    let mut p = c[c.len() - 1];
    for &ci in c[..c.len() - 1].iter().rev() {
        p = ci + shr_round(x * p, 30);
    }
    p
}

/// `e^{−t}` for `t ≥ 0` in Q7.24 (negative `t` counts as 0), in Q1.30. Exactly 1.0 at 0; 0 once
/// `e^{−t}` is below half an LSB (t > 21.5).
#[inline]
pub fn exp_neg_q24(t: i32) -> i32 {
    if t <= 0 {
        return ONE_Q30;
    }
    // u = t·log2(e) in Q.30 (t < 2^31, so u < 2^38.6: i64).
    let u = shr_round(t as i64 * LOG2E_Q30, 24);
    let n = (u >> 30) as u32;
    if n > 31 {
        return 0;
    }
    let f = u & (ONE_Q30 as i64 - 1);
    let p = horner(&EXP2_NEG, f);
    (if n == 0 { p } else { shr_round(p, n) }) as i32
}

/// `1/d` for `d ∈ [1, 2]` in Q1.30 (as u32), result in Q1.30 (`[0.5, 1]`).
#[inline]
pub fn recip_q30(d: u32) -> i32 {
    let d = d as i64;
    // Linear minimax start 24/17 − 8/17·d (relative error ≤ 1/17), then Newton
    // y ← y·(2 − d·y), which squares the relative error each step.
    let mut y = 1_515_870_810i64 - shr_round(505_290_270i64 * d, 30);
    for _ in 0..3 {
        let e = (2i64 << 30) - shr_round(d * y, 30);
        y = shr_round(y * e, 30);
    }
    y.min(ONE_Q30 as i64) as i32
}

/// `sigmoid(x)` for `x` in Q15.16, in Q1.30. For `x < 0` it is formed as `e^{x}/(1+e^{x})`,
/// which keeps the relative precision of small results.
#[inline]
pub fn sigmoid_q16(x: i32) -> i32 {
    let ax = x.unsigned_abs();
    let e = if ax >= 128 << 16 {
        0
    } else {
        exp_neg_q24((ax << 8) as i32)
    };
    let r = recip_q30(ONE_Q30 as u32 + e as u32);
    if x >= 0 {
        r
    } else {
        mul_q30(e, r)
    }
}

/// `x · sigmoid(x)` (SiLU) for `x` in Q15.16, in Q15.16.
#[inline]
pub fn silu_q16(x: i32) -> i32 {
    mul_q30(x, sigmoid_q16(x))
}

/// `ln(1 + u)` for `u ∈ [0, 1]` in Q1.30, in Q1.30.
#[inline]
pub fn ln1p_q30(u: i32) -> i32 {
    horner(&LN1P, u.clamp(0, ONE_Q30) as i64) as i32
}

/// `softplus(x) = ln(1 + e^{x})` for `x` in Q15.16, in Q7.24; `x` itself above 20 (torch's
/// threshold); saturates at `i32::MAX` (≈ 128) for larger `x`.
#[inline]
pub fn softplus_q16(x: i32) -> i32 {
    if x > 20 << 16 {
        return sat32((x as i64) << 8);
    }
    // softplus(x) = max(x, 0) + ln(1 + e^{−|x|}).
    let ax = x.unsigned_abs();
    let e = if ax >= 128 << 16 {
        0
    } else {
        exp_neg_q24((ax << 8) as i32)
    };
    let l = shr_round(ln1p_q30(e) as i64, 6);
    ((x.max(0) as i64) << 8) as i32 + l as i32
}

/// `1/sqrt(v)` for an integer `v > 0`, as a mantissa `y` in Q1.30 (`(0.5, 1]`) and a shift `k`:
/// `1/sqrt(v) ≈ y · 2^{−30−k}`. For `v = 0` it returns `(2^30, 0)` (callers multiply it by
/// zero).
#[inline]
pub fn rsqrt_u64(v: u64) -> (i32, u32) {
    if v == 0 {
        return (ONE_Q30, 0);
    }
    // v = 2^{2k} · u, u ∈ [1, 4), held in Q2.30.
    let bits = 64 - v.leading_zeros();
    let k = (bits - 1) / 2;
    let u = if 2 * k >= 30 {
        (v >> (2 * k - 30)) as i64
    } else {
        (v << (30 - 2 * k)) as i64
    };
    let mut y = RSQRT_SEED[((u >> 27) - 8) as usize];
    for _ in 0..3 {
        // y ← y · (3 − u·y²) / 2
        let y2 = shr_round(y * y, 30);
        let h = (3i64 << 30) - shr_round(u * y2, 30);
        y = shr_round(y * h, 31);
    }
    (y.min(ONE_Q30 as i64) as i32, k)
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q30: f64 = (1u64 << 30) as f64;
    const Q24: f64 = (1u64 << 24) as f64;
    const Q16: f64 = (1u64 << 16) as f64;

    /// A deterministic stream of u64s.
    fn rng(seed: &mut u64) -> u64 {
        *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[test]
    fn exp_neg_bound() {
        let mut worst = 0.0f64;
        let mut check = |t: i32| {
            let got = exp_neg_q24(t) as f64 / Q30;
            let want = (-(t.max(0) as f64) / Q24).exp();
            worst = worst.max((got - want).abs());
        };
        // Every Q7.24 value of [0, 1) (the whole polynomial domain is hit), a dense grid up
        // to 32 and random points over the whole range.
        for t in 0..(1 << 24) {
            check(t);
        }
        for t in (0..(32 << 24)).step_by(97) {
            check(t);
        }
        let mut s = 1;
        for _ in 0..200_000 {
            check((rng(&mut s) >> 33) as i32);
        }
        assert_eq!(exp_neg_q24(0), ONE_Q30);
        assert_eq!(exp_neg_q24(-5), ONE_Q30);
        assert_eq!(exp_neg_q24(i32::MAX), 0);
        assert!(worst <= 5e-9, "exp_neg max error {worst:e}");
    }

    #[test]
    fn recip_bound() {
        let mut worst = 0.0f64;
        for d in (ONE_Q30 as u32..=2 * ONE_Q30 as u32).step_by(61) {
            let got = recip_q30(d) as f64 / Q30;
            worst = worst.max((got - Q30 / d as f64).abs());
        }
        let d = 2 * ONE_Q30 as u32;
        worst = worst.max((recip_q30(d) as f64 / Q30 - 0.5).abs());
        assert!(worst <= 2e-9, "recip max error {worst:e}");
    }

    #[test]
    fn sigmoid_and_silu_bounds() {
        let (mut ws, mut wl) = (0.0f64, 0.0f64);
        let mut check = |x: i32| {
            let xf = x as f64 / Q16;
            let sig = 1.0 / (1.0 + (-xf).exp());
            ws = ws.max((sigmoid_q16(x) as f64 / Q30 - sig).abs());
            let silu = silu_q16(x) as f64 / Q16;
            // Bound: half an LSB of rounding plus |x| times the sigmoid bound.
            let allowed = 0.5 / Q16 + 5e-9 * xf.abs() + 1e-12;
            wl = wl.max((silu - xf * sig).abs() / allowed);
        };
        for x in (-(40 << 16)..(40 << 16)).step_by(7) {
            check(x);
        }
        let mut s = 2;
        for _ in 0..200_000 {
            check(rng(&mut s) as i32);
        }
        for x in [i32::MIN, i32::MAX, 0, 1, -1] {
            check(x);
        }
        assert!(ws <= 5e-9, "sigmoid max error {ws:e}");
        assert!(wl <= 1.0, "silu error exceeds its bound by {wl}");
        assert_eq!(sigmoid_q16(0), ONE_Q30 / 2);
    }

    #[test]
    fn softplus_bound() {
        let mut worst = 0.0f64;
        let mut check = |x: i32| {
            let xf = x as f64 / Q16;
            let want = if xf > 20.0 { xf } else { xf.exp().ln_1p() };
            let got = softplus_q16(x) as f64 / Q24;
            if want < 128.0 {
                worst = worst.max((got - want).abs());
            } else {
                assert_eq!(softplus_q16(x), i32::MAX);
            }
        };
        for x in (-(40 << 16)..(40 << 16)).step_by(5) {
            check(x);
        }
        let mut s = 3;
        for _ in 0..200_000 {
            check(rng(&mut s) as i32);
        }
        for x in [i32::MIN, i32::MAX, 0, 20 << 16, (20 << 16) + 1] {
            check(x);
        }
        assert!(worst <= 4.5e-8, "softplus max error {worst:e}");
    }

    #[test]
    fn rsqrt_bound() {
        let mut worst = 0.0f64;
        let mut check = |v: u64| {
            if v == 0 {
                return;
            }
            let (y, k) = rsqrt_u64(v);
            let got = y as f64 / Q30 / (1u64 << k) as f64;
            let want = 1.0 / (v as f64).sqrt();
            worst = worst.max((got / want - 1.0).abs());
        };
        for v in 1..200_000u64 {
            check(v);
        }
        let mut s = 4;
        for _ in 0..500_000 {
            let r = rng(&mut s);
            check(r >> (r % 64));
        }
        check(u64::MAX);
        assert!(worst <= 4e-9, "rsqrt max relative error {worst:e}");
        assert_eq!(rsqrt_u64(0), (ONE_Q30, 0));
    }
}
