//! The decay gate (spec §3.4) and the beta sigmoid (§3.3).

use crate::config::DecayGate;
use crate::error::{check_len, rows_of, KdaError};
use crate::math::{exp, sigmoid};
use crate::simd::{self, Isa};
use crate::weights::Data;

/// Turns raw decay-projection rows into log-decays `g ≤ 0`, **in place**.
///
/// `raw` is `[T, H, K]`; `a_log` is `[H]`, `dt_bias` `[H·K]` (both optional, but the softplus
/// form needs `a_log`). With `x = raw + dt_bias`:
/// softplus form `g = −exp(A_log)·softplus(x)`; lower-bound form `g = lb·sigmoid(exp(A_log)·x)`
/// (or `lb·sigmoid(x)` without `A_log`). On the portable path: `libm`'s numbers, those of
/// [`crate::math::softplus`] / [`crate::math::sigmoid`] (see [`decay_gate_on`] for the vector
/// paths).
pub fn decay_gate(
    raw: &mut [f32],
    form: DecayGate,
    a_log: Option<Data<'_>>,
    dt_bias: Option<Data<'_>>,
    heads: usize,
    head_dim: usize,
) -> Result<(), KdaError> {
    decay_gate_on(
        Isa::Portable,
        raw,
        form,
        (a_log, dt_bias),
        (heads, head_dim),
    )
}

/// [`decay_gate`] on path `isa` (the vector paths' `exp` and logarithm are a few ulp from
/// `libm`'s, as in the layer): `(a_log, dt_bias)` and `(heads, head_dim)` as there.
pub fn decay_gate_on(
    isa: Isa,
    raw: &mut [f32],
    form: DecayGate,
    (a_log, dt_bias): (Option<Data<'_>>, Option<Data<'_>>),
    (heads, head_dim): (usize, usize),
) -> Result<(), KdaError> {
    let d = heads
        .checked_mul(head_dim)
        .ok_or(KdaError::Overflow { what: "decay gate" })?;
    if d == 0 {
        return Err(KdaError::Config {
            field: "heads * head_dim",
            reason: "must be at least 1",
        });
    }
    rows_of("decay gate raw", raw.len(), d)?;
    if let Some(a) = &a_log {
        check_len("A_log", a.len(), heads)?;
    }
    if let Some(b) = &dt_bias {
        check_len("dt_bias", b.len(), d)?;
    }
    if matches!(form, DecayGate::Softplus) && a_log.is_none() {
        return Err(KdaError::Weights {
            arg: "A_log",
            reason: "required by the softplus decay gate",
        });
    }
    for row in raw.chunks_exact_mut(d) {
        for (h, run) in row.chunks_exact_mut(head_dim).enumerate() {
            let a = a_log.map(|a| exp(a.at(h)));
            decay_run(isa, form, (a, dt_bias), h * head_dim, run);
        }
    }
    Ok(())
}

/// The gate over channels `first..first + x.len()` of one head, **in place** on the raw values
/// `x`, with `a = exp(A_log[head])` precomputed (lengths already validated): `x + dt_bias`
/// (`+ 0.0` without a bias), then the form's function on path `isa` (`simd::softplus_scaled` /
/// `sigmoid_scaled`: the portable path gives the `libm` numbers of `math::softplus` /
/// `math::sigmoid`).
pub(crate) fn decay_run(
    isa: Isa,
    form: DecayGate,
    (a, dt_bias): (Option<f32>, Option<Data<'_>>),
    first: usize,
    x: &mut [f32],
) {
    add_bias(x, dt_bias, first);
    match form {
        DecayGate::Softplus => simd::softplus_scaled(isa, x, -a.unwrap_or(1.0)),
        DecayGate::LowerBound(lb) => {
            if let Some(a) = a {
                x.iter_mut().for_each(|v| *v *= a);
            }
            simd::sigmoid_scaled(isa, x, lb);
        }
    }
}

/// `x[i] += bias[first + i]` (`+ 0.0` without a bias, so that −0 becomes +0 as in the
/// formula), the bias read in its own type.
#[inline(always)]
fn add_bias(x: &mut [f32], bias: Option<Data<'_>>, first: usize) {
    let n = x.len();
    match bias {
        None => x.iter_mut().for_each(|v| *v += 0.0),
        Some(Data::F32(b)) => {
            for (v, &b) in x.iter_mut().zip(&b[first..first + n]) {
                *v += b;
            }
        }
        Some(Data::Bf16(b)) => {
            for (v, &b) in x.iter_mut().zip(&b[first..first + n]) {
                *v += crate::math::bf16_to_f32(b);
            }
        }
        Some(b) => {
            for (i, v) in x.iter_mut().enumerate() {
                *v += b.at(first + i);
            }
        }
    }
}

/// `β = sigmoid(logit)`, in place (`libm`'s numbers, as [`crate::math::sigmoid`]).
pub fn beta_sigmoid(logits: &mut [f32]) {
    for b in logits {
        *b = sigmoid(*b);
    }
}

/// [`beta_sigmoid`] on path `isa` (the vector paths' `exp`).
pub fn beta_sigmoid_on(isa: Isa, logits: &mut [f32]) {
    simd::sigmoid_scaled(isa, logits, 1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_follow_their_formulas() {
        let mut g = [0.3f32, -2.0, 25.0, -40.0];
        let a = [0.5f32, 1.5];
        let b = [0.1f32, 0.2, -0.1, 0.0];
        let raw = g;
        decay_gate(
            &mut g,
            DecayGate::Softplus,
            Some(Data::F32(&a)),
            Some(Data::F32(&b)),
            2,
            2,
        )
        .unwrap();
        for i in 0..4 {
            let x = (raw[i] + b[i]) as f64;
            let sp = if x > 20.0 { x } else { x.exp().ln_1p() };
            let want = -(a[i / 2] as f64).exp() * sp;
            assert!(
                (g[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1e-20),
                "{i}"
            );
        }
        let mut g = raw;
        decay_gate(
            &mut g,
            DecayGate::LowerBound(-5.0),
            Some(Data::F32(&a)),
            None,
            2,
            2,
        )
        .unwrap();
        for i in 0..4 {
            let z = (a[i / 2] as f64).exp() * raw[i] as f64;
            let want = -5.0 / (1.0 + (-z).exp());
            assert!((g[i] as f64 - want).abs() < 1e-6);
            assert!(g[i] <= 0.0 && g[i] >= -5.0);
        }
    }

    /// `decay_gate_on` / `beta_sigmoid_on` on every path this CPU has: the portable path gives
    /// `decay_gate` / `beta_sigmoid`'s bits, the vector paths the same within a few ulp (their
    /// `exp` and logarithm), over both forms, with and without bias, and raw values from −30
    /// to 30 (both branches of softplus, sigmoid saturating).
    #[test]
    fn every_path_matches_the_libm_gate() {
        let (heads, dim) = (3usize, 37usize);
        let raw: std::vec::Vec<f32> = (0..2 * heads * dim)
            .map(|i| ((i * 7919) % 601) as f32 * 0.1 - 30.0)
            .collect();
        let a = [0.5f32, -1.0, 1.5];
        let b: std::vec::Vec<f32> = (0..heads * dim)
            .map(|i| (i % 5) as f32 * 0.3 - 0.6)
            .collect();
        let forms = [DecayGate::Softplus, DecayGate::LowerBound(-5.0)];
        for isa in Isa::all_supported() {
            for (form, bias) in forms
                .iter()
                .flat_map(|&f| [(f, None), (f, Some(Data::F32(&b)))])
            {
                let mut want = raw.clone();
                decay_gate(&mut want, form, Some(Data::F32(&a)), bias, heads, dim).unwrap();
                let mut got = raw.clone();
                let ab = (Some(Data::F32(&a)), bias);
                decay_gate_on(isa, &mut got, form, ab, (heads, dim)).unwrap();
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    if isa == Isa::Portable {
                        assert_eq!(g.to_bits(), w.to_bits(), "{isa:?} {form:?} {i}");
                    } else {
                        let tol = 4e-6 * w.abs() + 1e-30;
                        assert!((g - w).abs() <= tol, "{isa:?} {form:?} {i}: {g} vs {w}");
                    }
                }
            }
            let mut want = raw.clone();
            beta_sigmoid(&mut want);
            let mut got = raw.clone();
            beta_sigmoid_on(isa, &mut got);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let tol = if isa == Isa::Portable { 0.0 } else { 4e-6 * w };
                assert!((g - w).abs() <= tol, "{isa:?} beta {i}: {g} vs {w}");
            }
        }
    }

    #[test]
    fn softplus_needs_a_log_and_lengths_are_checked() {
        let mut g = [0.0f32; 4];
        assert!(decay_gate(&mut g, DecayGate::Softplus, None, None, 2, 2).is_err());
        let a = [0.0f32; 3];
        assert!(matches!(
            decay_gate(
                &mut g,
                DecayGate::LowerBound(-5.0),
                Some(Data::F32(&a)),
                None,
                2,
                2
            ),
            Err(KdaError::Length { arg: "A_log", .. })
        ));
        let mut g = [0.0f32; 5];
        assert!(decay_gate(&mut g, DecayGate::LowerBound(-5.0), None, None, 2, 2).is_err());
    }
}
