//! The vector layer's tests: each ISA's [`Simd`] operations against the plain lanes of its
//! width, bit for bit, and the generic `exp` (the ISAs' one) against `libm`.

use half::bf16;
use std::vec::Vec;

use super::test_support::rnd;
use super::{lanes, vector, Isa};

/// Each ISA's few operations against the plain lanes of the same width, on values that
/// include NaN, infinities, ties and the exp limits.
#[test]
fn isa_operations_match_plain_lanes() {
    let vals: Vec<f32> = [
        0.5,
        -0.5,
        1.5,
        2.5,
        -2.5,
        0.0,
        -0.0,
        88.5,
        -88.5,
        -87.6,
        3.0,
        -127.0,
        127.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]
    .into_iter()
    .chain(rnd(400, 77).into_iter().map(|v| v * 50.0))
    .collect();
    let wide: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
    for (isa, ok) in Isa::all() {
        if !ok || isa == Isa::Portable {
            if !ok {
                std::println!("skipped: no {}", isa.feature());
            }
            continue;
        }
        check_ops(isa, &vals, &wide);
    }
}

/// Runs [`ops_trace`] for `isa` and for plain lanes of its width and compares them.
fn check_ops(isa: Isa, vals: &[f32], wide: &[bf16]) {
    let (got, want) = match isa {
        // SAFETY: `isa` is supported (checked by the caller).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe {
            (
                ops_trace(crate::simd::avx2::Avx2::new_unchecked(), vals, wide),
                ops_trace(lanes::Lanes::<8>, vals, wide),
            )
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512F => unsafe {
            (
                ops_trace(
                    crate::simd::avx512::Avx512::<false>::new_unchecked(),
                    vals,
                    wide,
                ),
                ops_trace(lanes::Lanes::<16>, vals, wide),
            )
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Bf16 => unsafe {
            (
                ops_trace(
                    crate::simd::avx512::Avx512::<true>::new_unchecked(),
                    vals,
                    wide,
                ),
                ops_trace(lanes::Lanes::<16>, vals, wide),
            )
        },
        // SAFETY: as above.
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => unsafe {
            (
                ops_trace(crate::simd::neon::Neon::new_unchecked(), vals, wide),
                ops_trace(lanes::Lanes::<4>, vals, wide),
            )
        },
        _ => return,
    };
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let ok = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(ok, "{isa:?} operation trace [{i}]: {g} vs plain lanes {w}");
    }
}

/// The results of every exactly-specified [`vector::Simd`] operation on `vals` (all but
/// `mul_add`, fused only on the ISAs, `reduce_sum`, whose order is the ISA's, and `exp`,
/// tested separately), in one list.
fn ops_trace<S: vector::Simd>(s: S, vals: &[f32], wide: &[bf16]) -> Vec<f32> {
    let l = S::LANES;
    let mut out = Vec::new();
    let put = |v: S::F, out: &mut Vec<f32>| {
        let mut buf = [0.0f32; vector::MAX_LANES];
        // SAFETY: `buf` holds MAX_LANES ≥ LANES f32.
        unsafe { s.store(buf.as_mut_ptr(), v) };
        out.extend_from_slice(&buf[..l]);
    };
    let exponents: Vec<f32> = (-127..=128).map(|n| n as f32).collect();
    for n in exponents.chunks_exact(l) {
        // SAFETY: LANES values.
        put(s.pow2i(unsafe { s.load(n.as_ptr()) }), &mut out);
    }
    for (i, (c, cw)) in vals.chunks_exact(l).zip(wide.chunks_exact(l)).enumerate() {
        // SAFETY: each chunk holds LANES values; `rows` has LANES pointers, each to at
        // least LANES (+ 1 for bf16) values.
        unsafe {
            let a = s.load(c.as_ptr());
            let b = s.add(a, s.splat(-3.0));
            put(b, &mut out);
            put(s.mul(a, b), &mut out);
            put(s.sub(b, a), &mut out);
            put(s.clamp(a, -88.0, 88.0), &mut out);
            put(s.round(s.clamp(a, -88.0, 88.0)), &mut out);
            put(s.zero_below(a, -87.5, b), &mut out);
            put(s.load_bf16(cw.as_ptr()), &mut out);
            put(s.broadcast(&c[3]), &mut out);
            put(s.load_partial(c.as_ptr(), 3), &mut out);
            let mut part = [9.0f32; vector::MAX_LANES];
            s.store_partial(part.as_mut_ptr(), l - 1, a);
            out.extend_from_slice(&part[..l]);
            let rows: Vec<*const f32> = (0..l).map(|r| vals[i + r * l..].as_ptr()).collect();
            let tile = s.load_tile(&rows, 1);
            for j in 0..l {
                put(s.tile_col(&tile, j), &mut out);
            }
            let rows: Vec<*const bf16> = (0..l).map(|r| wide[i + r..].as_ptr()).collect();
            let tile = s.load_tile(&rows, 1);
            for j in 0..l {
                put(s.tile_col(&tile, j), &mut out);
            }
            check_lane_ops(s, a, b, &wide[i * l..]);
            // bf16 pairs: this chunk's bf16 as the even elements, the next ones as the odd.
            let odd = &wide[(i * l + 1).min(wide.len() - l)..];
            let pa = s.load_pairs(cw.as_ptr(), odd.as_ptr());
            let pair = vector::round_pair(c[0], c[1]);
            put(s.dot_pairs(b, pa, s.broadcast_pair(&pair)), &mut out);
            let sum = s.reduce_sum(a);
            let want: f32 = c.iter().sum();
            let ok = (sum - want).abs() <= 1e-5 * c.iter().map(|v| v.abs()).sum::<f32>();
            assert!(ok || !want.is_finite(), "reduce_sum {sum} vs {want}");
        }
    }
    out
}

/// `mul_add_lane::<J>` is `mul_add` with lane `J` splatted, `load_bf16_pair` is two
/// `load_bf16`, `load_bf16_parity` and `deinterleave` give the even and the odd elements,
/// and `interleave` undoes `deinterleave`, bit for bit (NaN matching NaN); `wide` holds at
/// least `LANES` bf16 (pairs are read only where it holds `2·LANES`).
///
/// # Safety
/// `S`'s instruction set is available.
unsafe fn check_lane_ops<S: vector::Simd>(s: S, a: S::F, b: S::F, wide: &[bf16]) {
    let l = S::LANES;
    let lanes = |v: S::F| {
        let mut buf = [0.0f32; vector::MAX_LANES];
        s.store(buf.as_mut_ptr(), v);
        buf
    };
    let same = |x: S::F, y: S::F, what: &str| {
        for (x, y) in lanes(x).iter().zip(lanes(y).iter()).take(l) {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "{what}: {x} vs {y}"
            );
        }
    };
    let (al, c) = (lanes(a), s.splat(0.375));
    // The lane is a const parameter: one call per lane.
    macro_rules! lane {
        ($($j:literal),*) => {$(
            same(
                s.mul_add_lane::<$j>(a, b, c),
                s.mul_add(s.splat(al[$j]), b, c),
                concat!("lane ", $j),
            );
        )*};
    }
    lane!(0, 1, 2, 3);
    if wide.len() >= 2 * l {
        let (lo, hi) = s.load_bf16_pair(wide.as_ptr());
        same(lo, s.load_bf16(wide.as_ptr()), "bf16 pair, first");
        same(hi, s.load_bf16(wide[l..].as_ptr()), "bf16 pair, second");
        let widened: Vec<f32> = wide[..2 * l].iter().map(|&w| w.to_f32()).collect();
        let split = |parity: usize| {
            let v: Vec<f32> = widened.iter().skip(parity).step_by(2).copied().collect();
            s.load(v.as_ptr())
        };
        let (even, odd) = s.load_bf16_parity(wide.as_ptr());
        same(even, split(0), "bf16 parity, even");
        same(odd, split(1), "bf16 parity, odd");
        let (even, odd) = s.deinterleave(s.load(widened.as_ptr()), s.load(widened[l..].as_ptr()));
        same(even, split(0), "deinterleave, even");
        same(odd, split(1), "deinterleave, odd");
        let (first, second) = s.interleave(even, odd);
        same(first, s.load(widened.as_ptr()), "interleave, first");
        same(second, s.load(widened[l..].as_ptr()), "interleave, second");
    }
}

/// The generic `exp` (the ISAs' one) on plain lanes: within 2 ulp of `libm`.
#[test]
fn generic_exp_polynomial_is_within_two_ulp() {
    let s = lanes::Lanes::<16>;
    let mut xs: Vec<f32> = (0..4000).map(|i| -100.0 + i as f32 * 0.0471).collect();
    xs.extend([
        0.0,
        -0.0,
        -87.0,
        -87.4,
        -87.6,
        88.0,
        88.7,
        f32::NEG_INFINITY,
        f32::NAN,
    ]);
    while !xs.len().is_multiple_of(16) {
        xs.push(1.0);
    }
    for c in xs.chunks_exact(16) {
        let mut y = [0.0f32; 16];
        // SAFETY: 16 values in and out.
        unsafe {
            vector::Simd::store(
                s,
                y.as_mut_ptr(),
                vector::exp_poly(s, vector::Simd::load(s, c.as_ptr())),
            )
        };
        for (&x, &v) in c.iter().zip(&y) {
            let want = libm::expf(x);
            if x.is_nan() {
                assert!(v.is_nan());
            } else if x < -87.5 {
                assert!(v == 0.0 || (v - want).abs() < 1e-37, "{x}: {v}");
            } else if x > 88.0 {
                // Documented: clamped to e^88.
                let at88 = libm::expf(88.0);
                assert!((v - at88).abs() <= 2.5e-7 * at88, "exp_poly({x}) = {v}");
            } else {
                assert!(
                    (v - want).abs() <= 2.5e-7 * want,
                    "exp_poly({x}) = {v}, libm {want}"
                );
            }
        }
    }
}
