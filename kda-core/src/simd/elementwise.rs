//! Functions applied element by element: `exp` and what is built on it (sigmoid, softplus,
//! the short conv's SiLU), each lane through a `LaneMap` rather than a
//! closure: the safe wrappers, their kernels and their tests.

use super::{dispatch, portable, Path};

/// `x[i] = e^{x[i]}` (vector paths: Cephes polynomial, < 2 ulp; flushes below e^−87.5 to 0;
/// the portable path: `libm`).
#[inline]
pub fn exp_in_place(isa: impl Into<Path>, x: &mut [f32]) {
    dispatch!(isa, exp_in_place(x), portable::exp_in_place(x))
}

/// `x[i] = c · sigmoid(x[i])` (vector paths: with their `exp`; the portable path: `libm`, as
/// `crate::math::sigmoid`).
#[inline]
pub fn sigmoid_scaled(isa: impl Into<Path>, x: &mut [f32], c: f32) {
    dispatch!(isa, sigmoid_scaled(x, c), portable::sigmoid_scaled(x, c))
}

/// `x[i] = c · softplus(x[i])`, `softplus(x) = ln(1 + e^x)` (`x` itself above 20). Vector
/// paths: `max(x, 0) + ln(1 + e^{−|x|})` with their `exp` and a series for the logarithm (a
/// few ulp from `libm`); the portable path: `libm`, as `crate::math::softplus`.
#[inline]
pub fn softplus_scaled(isa: impl Into<Path>, x: &mut [f32], c: f32) {
    dispatch!(isa, softplus_scaled(x, c), portable::softplus_scaled(x, c))
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use crate::simd::vector::Simd;

    /// `x[i] = e^{x[i]}`: groups of [`EXP_GROUP`] vectors in lockstep ([`Simd::exp_n`]), then the
    /// rest through [`map_in_place`].
    #[inline(always)]
    pub(crate) unsafe fn exp_in_place<S: Simd>(s: S, x: &mut [f32]) {
        let (p, step) = (x.as_mut_ptr(), EXP_GROUP * S::LANES);
        let mut i = 0;
        while i + step <= x.len() {
            let mut v = [s.splat(0.0); EXP_GROUP];
            for (j, v) in v.iter_mut().enumerate() {
                *v = s.load(p.add(i + j * S::LANES));
            }
            for (j, e) in s.exp_n(v).iter().enumerate() {
                s.store(p.add(i + j * S::LANES), *e);
            }
            i += step;
        }
        map_in_place(s, &mut x[i..], &Exp);
    }

    /// `e^x` ([`Simd::exp`]) as a [`LaneMap`].
    struct Exp;

    impl<S: Simd> LaneMap<S> for Exp {
        #[inline(always)]
        fn apply(&self, s: S, v: S::F) -> S::F {
            s.exp(v)
        }
    }

    /// Vectors whose exponents [`exp_in_place`] and [`tame_rows`](crate::simd::tame_rows)
    /// (`tame_vectors`) take in lockstep ([`Simd::exp_n`]): 1.4× faster for `tame_rows` on Zen 4
    /// (AVX-512 and AVX2) than one vector at a time, 2 and 8 measured no better than 4.
    pub(crate) const EXP_GROUP: usize = 4;

    /// A function applied lane by lane ([`map_in_place`]). A trait rather than a closure: a
    /// closure is not compiled with the entry point's target features, so the intrinsics inside
    /// it would not inline.
    trait LaneMap<S: Simd> {
        fn apply(&self, s: S, v: S::F) -> S::F;
    }

    /// `x[i] = f(x[i])`, `LANES` at a time, the tail through a partial vector.
    #[inline(always)]
    unsafe fn map_in_place<S: Simd>(s: S, x: &mut [f32], f: &impl LaneMap<S>) {
        let n = x.len();
        let p = x.as_mut_ptr();
        let mut i = 0;
        while i + S::LANES <= n {
            s.store(p.add(i), f.apply(s, s.load(p.add(i))));
            i += S::LANES;
        }
        if i < n {
            let r = n - i;
            s.store_partial(p.add(i), r, f.apply(s, s.load_partial(p.add(i), r)));
        }
    }

    /// `c · sigmoid(x)`.
    struct ScaledSigmoid(f32);

    impl<S: Simd> LaneMap<S> for ScaledSigmoid {
        #[inline(always)]
        fn apply(&self, s: S, v: S::F) -> S::F {
            s.mul(s.splat(self.0), sigmoid(s, v))
        }
    }

    /// `c · softplus(x)`.
    struct ScaledSoftplus(f32);

    impl<S: Simd> LaneMap<S> for ScaledSoftplus {
        #[inline(always)]
        fn apply(&self, s: S, v: S::F) -> S::F {
            s.mul(s.splat(self.0), softplus(s, v))
        }
    }

    /// `1 / (1 + e^{−x})` with the ISA's `exp`.
    #[inline(always)]
    fn sigmoid<S: Simd>(s: S, x: S::F) -> S::F {
        let one = s.splat(1.0);
        s.div(one, s.add(one, s.exp(s.mul(x, s.splat(-1.0)))))
    }

    /// `x / (1 + e^{−x})` (SiLU) with the ISA's `exp`: the short conv's activation.
    #[inline(always)]
    pub(crate) fn silu<S: Simd>(s: S, x: S::F) -> S::F {
        let e = s.exp(s.mul(x, s.splat(-1.0)));
        s.div(x, s.add(s.splat(1.0), e))
    }

    /// `ln(1 + e^x)` as `max(x, 0) + ln(1 + e^{−|x|})`, the logarithm of `1 + y` (`0 ≤ y ≤ 1`)
    /// as `2·atanh(y / (2 + y))`, a series in `z² ≤ 1/9` cut after `z¹³` (relative error below
    /// 2·10⁻⁸ before rounding). Above 20 the result rounds to `x`, as torch's threshold returns;
    /// `±∞` give `∞` and `0`; NaN stays NaN.
    #[inline(always)]
    fn softplus<S: Simd>(s: S, x: S::F) -> S::F {
        let m = s.zero_below(x, 0.0, x);
        // −|x| from a finite copy (so that ∞ − ∞ cannot appear); e^{−|x|} is 0 there anyway.
        let xc = s.clamp(x, -1e38, 1e38);
        let y = s.exp(s.mul_add(s.splat(-2.0), s.zero_below(xc, 0.0, xc), xc));
        let z = s.div(y, s.add(s.splat(2.0), y));
        let z2 = s.mul(z, z);
        let mut p = s.splat(1.0 / 13.0);
        for c in [1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0] {
            p = s.mul_add(p, z2, s.splat(c));
        }
        s.add(m, s.mul(s.add(z, z), p))
    }

    /// `x[i] = c · sigmoid(x[i])`.
    #[inline(always)]
    pub(crate) unsafe fn sigmoid_scaled<S: Simd>(s: S, x: &mut [f32], c: f32) {
        map_in_place(s, x, &ScaledSigmoid(c))
    }

    /// `x[i] = c · softplus(x[i])`.
    #[inline(always)]
    pub(crate) unsafe fn softplus_scaled<S: Simd>(s: S, x: &mut [f32], c: f32) {
        map_in_place(s, x, &ScaledSoftplus(c))
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn exp_in_place(x: &mut [f32]) {
                $crate::simd::elementwise::kernels::exp_in_place($token, x)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn sigmoid_scaled(x: &mut [f32], c: f32) {
                $crate::simd::elementwise::kernels::sigmoid_scaled($token, x, c)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn softplus_scaled(x: &mut [f32], c: f32) {
                $crate::simd::elementwise::kernels::softplus_scaled($token, x, c)
            }
        };
    }
    pub(crate) use entry_points;
}

super::instantiate!();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::test_support::{exact, test_paths};
    use std::vec::Vec;

    /// The vector sigmoid and softplus against `libm` (the portable path) on every path:
    /// within a few ulp, or 1e-37 absolute where the vector `exp` flushes; NaN, ±∞, ±0 and the
    /// softplus threshold included; the portable path itself bit for bit.
    #[test]
    fn sigmoid_and_softplus_match_libm() {
        let mut xs: Vec<f32> = (0..3000).map(|i| -120.0 + i as f32 * 0.0801).collect();
        xs.extend([
            0.0,
            -0.0,
            19.999,
            20.0,
            20.001,
            1e-30,
            -1e-30,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        for path in core::iter::once(Path::Reference).chain(test_paths()) {
            for c in [1.0f32, -0.75] {
                let (mut sig, mut sp) = (xs.clone(), xs.clone());
                sigmoid_scaled(path, &mut sig, c);
                softplus_scaled(path, &mut sp, c);
                for (i, &x) in xs.iter().enumerate() {
                    let want_sig = c * crate::math::sigmoid(x);
                    let want_sp = c * crate::math::softplus(x);
                    for (got, want, what) in
                        [(sig[i], want_sig, "sigmoid"), (sp[i], want_sp, "softplus")]
                    {
                        let ok = if want.is_nan() {
                            got.is_nan()
                        } else if path == Path::Reference {
                            got.to_bits() == want.to_bits()
                        } else {
                            got == want || (got - want).abs() <= 6e-7 * want.abs() + 1e-37
                        };
                        assert!(ok, "{path:?} {what}({x}) · {c}: {got} vs {want}");
                    }
                }
            }
        }
    }

    #[test]
    fn exp_paths_agree_and_handle_extremes() {
        let mut xs: Vec<f32> = (0..2000).map(|i| -100.0 + i as f32 * 0.0937).collect();
        xs.extend([
            0.0,
            -0.0,
            -87.0,
            -87.6,
            -1000.0,
            80.0,
            88.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        for isa in test_paths() {
            let mut y = xs.clone();
            exp_in_place(isa, &mut y);
            for (&x, &v) in xs.iter().zip(&y) {
                // Vectors taken in lockstep give the bits of one taken alone (a 1-lane tail).
                let mut alone = [x];
                exp_in_place(isa, &mut alone);
                assert!(
                    v.to_bits() == alone[0].to_bits() || v.is_nan() && alone[0].is_nan(),
                    "{isa:?} exp({x}): {v} in a slice, {} alone",
                    alone[0]
                );
                let want = libm::expf(x);
                if exact(isa) {
                    assert!(v.to_bits() == want.to_bits() || v.is_nan() && want.is_nan());
                } else if x.is_nan() {
                    assert!(v.is_nan());
                } else if x < -87.5 {
                    assert!(v == 0.0 || (v - want).abs() < 1e-37, "{x}: {v}");
                } else {
                    assert!(
                        (v - want).abs() <= 2.5e-7 * want,
                        "{isa:?} exp({x}) = {v}, libm {want}"
                    );
                }
            }
        }
    }
}
