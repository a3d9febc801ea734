//! The gated delta rule for one head and one token (spec §2), and a per-sequence driver.
//!
//! ```text
//! S ← diag(exp(g)) S          decay the key rows first
//! p = Sᵀ k                    predict with the decayed state
//! S ← S + β k (v − p)ᵀ        delta-rule write
//! o = Sᵀ (scale · q)          read after the write
//! ```
//! The state `S` is `[K, V]` row-major (K-first). Two passes over `S`: the first decays and
//! predicts, the second writes and reads, so each element is loaded and stored twice per token.
//!
//! NaN or ±∞ anywhere in the inputs propagate into the state and output; nothing panics.

use super::{HeadDims, HeadRows};
use crate::error::{check_len, KdaError};
use crate::math::exp;
use crate::simd::{self, Isa};

/// One token of the delta rule for one head (`rows` of one token), in place on its state.
///
/// `rows.v_o` is `[V]` and is overwritten with the β-scaled innovation `δ = β(v − p)`; `out`
/// `[V]` receives `o`. Lengths are checked.
pub fn delta_rule_step(rows: HeadRows<'_>, out: &mut [f32]) -> Result<(), KdaError> {
    check_len("beta", rows.beta.len(), 1)?;
    let dims = rows.dims()?;
    check_len("out", out.len(), dims.v)?;
    step_unchecked(rows, out);
    Ok(())
}

/// [`delta_rule_step`] after validation (all lengths consistent), on the portable path.
#[inline]
pub(crate) fn step_unchecked(rows: HeadRows<'_>, out: &mut [f32]) {
    let token = Token {
        q: rows.q,
        k: rows.k,
        beta: rows.beta[0],
        scale: rows.scale,
    };
    let (v, state) = (rows.v_o, rows.state);
    if v.is_empty() {
        return;
    }
    // Pass 1 one key row at a time, so the decay factors need no scratch.
    out.fill(0.0);
    for ((row, &k), &g) in state.chunks_exact_mut(v.len()).zip(token.k).zip(rows.g) {
        simd::decay_predict(Isa::Portable, row, exp(g), k, out);
    }
    write_and_read(Isa::Portable, state, &token, v, out);
}

/// f32 elements of scratch [`recurrent_head`] needs for key dim `k` and value dim `v`.
pub fn recurrent_scratch_len(k: usize, v: usize) -> usize {
    k + v
}

/// The recurrence over `T` rows of one head of one sequence, on the fastest path `isa`:
/// `q`, `k`, `g` `[T, K]`, `v_o` `[T, V]` (values in, outputs out), `beta` `[T]`, `state`
/// `[K, V]` in/out, `scratch` at least [`recurrent_scratch_len`]`(K, V)`.
pub fn recurrent_head(isa: Isa, rows: HeadRows<'_>, scratch: &mut [f32]) -> Result<(), KdaError> {
    run_head(isa, rows, None, scratch)
}

/// [`recurrent_head`] from the initial state `initial` `[K, V]`, which is left as it was:
/// `rows.state` receives the final state (what it held is not read). Bitwise the same as
/// copying `initial` into `rows.state` and calling [`recurrent_head`], without the copy's own
/// pass over memory (the first token's first pass reads `initial`). With no rows, the final
/// state is `initial`.
pub fn recurrent_head_from(
    isa: Isa,
    rows: HeadRows<'_>,
    initial: &[f32],
    scratch: &mut [f32],
) -> Result<(), KdaError> {
    check_len("initial state", initial.len(), rows.state.len())?;
    if rows.beta.is_empty() {
        rows.state.copy_from_slice(initial);
        return Ok(());
    }
    run_head(isa, rows, Some(initial), scratch)
}

/// [`recurrent_head`], the state before the first token read from `initial` when given.
fn run_head(
    isa: Isa,
    rows: HeadRows<'_>,
    mut initial: Option<&[f32]>,
    scratch: &mut [f32],
) -> Result<(), KdaError> {
    let HeadDims {
        t: t_len,
        k: kd,
        v: vd,
    } = rows.dims()?;
    let HeadRows {
        q,
        k,
        g,
        beta,
        v_o,
        state,
        scale,
    } = rows;
    if t_len == 0 {
        return Ok(());
    }
    if scratch.len() < kd + vd {
        return Err(KdaError::TooSmall {
            arg: "recurrent scratch",
            needed: kd + vd,
            actual: scratch.len(),
        });
    }
    let (decay, rest) = scratch.split_at_mut(kd);
    let out = &mut rest[..vd];
    for t in 0..t_len {
        let row = t * kd..(t + 1) * kd;
        decay.copy_from_slice(&g[row.clone()]);
        simd::exp_in_place(isa, decay);
        let vrow = &mut v_o[t * vd..(t + 1) * vd];
        let token = Token {
            q: &q[row.clone()],
            k: &k[row],
            beta: beta[t],
            scale,
        };
        fused_step(isa, (initial.take(), state), &token, decay, vrow, out);
        vrow.copy_from_slice(out);
    }
    Ok(())
}

/// One recorded token of a speculative verify, for [`replay_step`].
pub(crate) struct ReplayToken<'a> {
    /// The normalised key `[K]`.
    pub(crate) k: &'a [f32],
    pub(crate) beta: f32,
    /// `[K]` zeros: the query of the read, which leaves the state alone.
    pub(crate) zeros: &'a [f32],
    /// `[K]` decay factors `e^{g}`.
    pub(crate) decay: &'a [f32],
}

/// The state update of one token, bitwise as [`recurrent_head`] does it: `delta` holds the
/// value `[V]` on entry (δ on return); `out` `[V]` is scratch.
pub(crate) fn replay_step(
    isa: Isa,
    state: &mut [f32],
    t: &ReplayToken<'_>,
    delta: &mut [f32],
    out: &mut [f32],
) {
    let token = Token {
        q: t.zeros,
        k: t.k,
        beta: t.beta,
        scale: 1.0,
    };
    fused_step(isa, (None, state), &token, t.decay, delta, out);
}

/// One token's read-only inputs for one head.
struct Token<'a> {
    q: &'a [f32],
    k: &'a [f32],
    beta: f32,
    scale: f32,
}

/// One token given the decay factors `e^{g}` of each key row (`[K]`): two passes over the
/// state, each row loaded and stored once per pass (the first reads `src` instead of `state`
/// when given). `v` becomes δ; `out` receives `o`.
#[inline]
fn fused_step(
    isa: Isa,
    (src, state): (Option<&[f32]>, &mut [f32]),
    t: &Token<'_>,
    decay: &[f32],
    v: &mut [f32],
    out: &mut [f32],
) {
    if v.is_empty() {
        if let Some(src) = src {
            state.copy_from_slice(src);
        }
        return;
    }
    out.fill(0.0);
    match src {
        Some(src) => simd::decay_predict_rows_from(isa, src, state, t.k, decay, out),
        None => simd::decay_predict_rows(isa, state, t.k, decay, out),
    }
    write_and_read(isa, state, t, v, out);
}

/// The rest of a token once pass 1 has left the prediction `p` in `out`: `v ← β(v − p)` (δ),
/// then pass 2 writes `S += k δᵀ` and reads `o` into `out`.
#[inline]
fn write_and_read(isa: Isa, state: &mut [f32], t: &Token<'_>, v: &mut [f32], out: &mut [f32]) {
    for (x, p) in v.iter_mut().zip(out.iter()) {
        *x = t.beta * (*x - *p);
    }
    out.fill(0.0);
    simd::write_read_rows(isa, state, t.k, v, (t.q, t.scale), out);
}

/// One sequence's rows for all heads in the layout of fla's `naive_recurrent_kda` with batch 1:
/// `q`, `k`, `g` `[T, H, K]`, `v` `[T, H, V]` (overwritten with δ), `beta` `[T, H]`, `state`
/// `[H, K, V]` in/out.
#[derive(Debug)]
pub struct SequenceRows<'a> {
    /// `[T, H, K]` queries (L2-normalised).
    pub q: &'a [f32],
    /// `[T, H, K]` keys (L2-normalised).
    pub k: &'a [f32],
    /// `[T, H, V]` values in, the innovations `δ` out.
    pub v: &'a mut [f32],
    /// `[T, H, K]` log-decays (≤ 0).
    pub g: &'a [f32],
    /// `[T, H]` write strengths.
    pub beta: &'a [f32],
    /// `[H, K, V]` K-first states: initial in, final out.
    pub state: &'a mut [f32],
}

/// Runs the recurrence over `T` tokens of one sequence for all heads, fla's
/// `naive_recurrent_kda` with batch 1: `rows` ([`SequenceRows`]) of `heads` heads of key and
/// value dim `head_dim`, queries scaled by `scale`; `out` `[T, H, V]`.
pub fn recurrent_sequence(
    rows: SequenceRows<'_>,
    heads: usize,
    head_dim: usize,
    scale: f32,
    out: &mut [f32],
) -> Result<(), KdaError> {
    let SequenceRows {
        q,
        k,
        v,
        g,
        beta,
        state,
    } = rows;
    let hk = heads
        .checked_mul(head_dim)
        .ok_or(KdaError::Overflow { what: "recurrence" })?;
    if hk == 0 || !q.len().is_multiple_of(hk) {
        return Err(KdaError::Length {
            arg: "q",
            expected: q.len() - q.len() % hk.max(1),
            actual: q.len(),
        });
    }
    let t_len = q.len() / hk;
    check_len("k", k.len(), q.len())?;
    check_len("v", v.len(), q.len())?;
    check_len("g", g.len(), q.len())?;
    check_len("out", out.len(), q.len())?;
    check_len("beta", beta.len(), t_len * heads)?;
    check_len("state", state.len(), hk * head_dim)?;
    for t in 0..t_len {
        for h in 0..heads {
            let r = (t * heads + h) * head_dim..(t * heads + h + 1) * head_dim;
            let rows = HeadRows {
                q: &q[r.clone()],
                k: &k[r.clone()],
                g: &g[r.clone()],
                beta: &beta[t * heads + h..t * heads + h + 1],
                v_o: &mut v[r.clone()],
                state: &mut state[h * head_dim * head_dim..(h + 1) * head_dim * head_dim],
                scale,
            };
            step_unchecked(rows, &mut out[r]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// Dense f64 form: S_t = (I − β k kᵀ) diag(α) S_{t−1} + β k vᵀ, o = scale Sᵀ q.
    #[test]
    fn step_matches_dense_matrix_form() {
        let (kd, vd) = (5usize, 3usize);
        let mut s = 3u64;
        let mut r = || crate::test_rng::uniform(&mut s);
        let q: Vec<f32> = (0..kd).map(|_| r()).collect();
        let k: Vec<f32> = (0..kd).map(|_| r() * 0.4).collect();
        let v: Vec<f32> = (0..vd).map(|_| r()).collect();
        let g: Vec<f32> = (0..kd).map(|_| -r().abs()).collect();
        let st: Vec<f32> = (0..kd * vd).map(|_| r()).collect();
        let (beta, scale) = (0.7f32, 0.3f32);

        let mut dec = std::vec![0f64; kd * vd];
        for d in 0..kd {
            for e in 0..vd {
                dec[d * vd + e] = (g[d] as f64).exp() * st[d * vd + e] as f64;
            }
        }
        let mut want = std::vec![0f64; kd * vd];
        for i in 0..kd {
            for e in 0..vd {
                let mut acc = 0.0;
                for j in 0..kd {
                    let m =
                        if i == j { 1.0 } else { 0.0 } - beta as f64 * k[i] as f64 * k[j] as f64;
                    acc += m * dec[j * vd + e];
                }
                want[i * vd + e] = acc + beta as f64 * k[i] as f64 * v[e] as f64;
            }
        }
        let mut state = st.clone();
        let mut vv = v.clone();
        let mut out = std::vec![0f32; vd];
        delta_rule_step(
            HeadRows {
                q: &q,
                k: &k,
                g: &g,
                beta: &[beta],
                v_o: &mut vv,
                state: &mut state,
                scale,
            },
            &mut out,
        )
        .unwrap();
        for i in 0..kd * vd {
            assert!((state[i] as f64 - want[i]).abs() < 1e-6);
        }
        for e in 0..vd {
            let o: f64 = (0..kd)
                .map(|d| scale as f64 * q[d] as f64 * want[d * vd + e])
                .sum();
            assert!((out[e] as f64 - o).abs() < 1e-6);
        }
    }

    #[test]
    fn hard_reset_gate_forgets_the_state() {
        let mut state = [5.0f32; 4];
        let (q, k, g) = ([1.0f32, 0.0], [0.0f32, 0.0], [-1000.0f32, -1000.0]);
        let mut v = [1.0f32, 2.0];
        let mut out = [0.0f32; 2];
        delta_rule_step(
            HeadRows {
                q: &q,
                k: &k,
                g: &g,
                beta: &[0.5],
                v_o: &mut v,
                state: &mut state,
                scale: 1.0,
            },
            &mut out,
        )
        .unwrap();
        assert_eq!(state, [0.0; 4]);
        assert_eq!(out, [0.0; 2]);
    }

    #[test]
    fn mismatched_lengths_are_errors() {
        let mut state = [0.0f32; 6];
        let mut v = [0.0f32; 3];
        let mut out = [0.0f32; 3];
        let e = delta_rule_step(
            HeadRows {
                q: &[0.0; 2],
                k: &[0.0; 2],
                g: &[0.0; 3],
                beta: &[0.5],
                v_o: &mut v,
                state: &mut state,
                scale: 1.0,
            },
            &mut out,
        );
        assert!(matches!(e, Err(KdaError::Length { arg: "g", .. })));
    }

    /// `recurrent_head_from` equals copying the initial state and running `recurrent_head`,
    /// bitwise, on every path this CPU has (K = 37, V = 45 for the column tails; 1 and 5
    /// tokens; whatever the output buffer held), leaves the initial state alone, hands it
    /// over unchanged for no tokens and refuses an initial state of the wrong length.
    #[test]
    fn run_from_an_initial_state_equals_copy_then_run() {
        let (kd, vd) = (37usize, 45usize);
        let mut seed = 11u64;
        let mut r = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| crate::test_rng::uniform(&mut seed))
                .collect()
        };
        let initial = r(kd * vd);
        for isa in Isa::all_supported() {
            for t in [0usize, 1, 5] {
                let (q, k, v) = (r(t * kd), r(t * kd), r(t * vd));
                let g: Vec<f32> = r(t * kd).iter().map(|x| -x.abs()).collect();
                let beta = r(t);
                let mut scratch = vec![0.0; recurrent_scratch_len(kd, vd)];
                fn rows<'a>(
                    (q, k, g, beta): (&'a [f32], &'a [f32], &'a [f32], &'a [f32]),
                    state: &'a mut [f32],
                    v_o: &'a mut [f32],
                ) -> HeadRows<'a> {
                    HeadRows {
                        q,
                        k,
                        g,
                        beta,
                        v_o,
                        state,
                        scale: 0.3,
                    }
                }
                let inputs = (&q[..], &k[..], &g[..], &beta[..]);
                let (mut s1, mut o1) = (initial.clone(), v.clone());
                recurrent_head(isa, rows(inputs, &mut s1, &mut o1), &mut scratch).unwrap();
                let (mut s2, mut o2) = (r(kd * vd), v.clone());
                let from = rows(inputs, &mut s2, &mut o2);
                recurrent_head_from(isa, from, &initial, &mut scratch).unwrap();
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&s1), bits(&s2), "{isa:?} T={t} state");
                assert_eq!(bits(&o1), bits(&o2), "{isa:?} T={t} outputs");
            }
        }
        let mut state = vec![0.0; kd * vd];
        let (mut v, mut scratch) = (vec![0.0; vd], vec![0.0; kd + vd]);
        let rows = HeadRows {
            q: &[0.0; 37],
            k: &[0.0; 37],
            g: &[0.0; 37],
            beta: &[0.5],
            v_o: &mut v,
            state: &mut state,
            scale: 1.0,
        };
        let e = recurrent_head_from(Isa::Portable, rows, &initial[1..], &mut scratch);
        assert!(matches!(
            e,
            Err(KdaError::Length {
                arg: "initial state",
                ..
            })
        ));
    }
}
