//! Short causal depthwise convolution with SiLU (fla's `ShortConvolution`, spec §7).
//!
//! For channel `c` at time `t`: `y = silu(Σ_{i<W} w[c,i] · s[t−(W−1)+i, c])`, where the stream
//! `s` is the channel's conv state followed by the raw inputs; `w[c, W−1]` hits the current token.
//!
//! **Conv-state layout** (one sequence, one of q/k/v): `[D, W−1]` f32, channel-major, each
//! channel's last `W−1` raw (pre-conv) inputs **oldest first**; zeros stand for history before
//! the sequence started. (fla keeps `W` slots, the oldest never read; vLLM keeps `W−1` as here.)

use crate::error::{check_len, rows_of, KdaError};
use crate::math::silu;
use crate::weights::Data;

fn check(
    x_len: usize,
    d: usize,
    weight: &Data<'_>,
    state: &[f32],
) -> Result<(usize, usize), KdaError> {
    if d == 0 {
        return Err(KdaError::Config {
            field: "conv channels",
            reason: "must be at least 1",
        });
    }
    let w = rows_of("conv weight", weight.len(), d)?;
    if w == 0 {
        return Err(KdaError::Length {
            arg: "conv weight",
            expected: d,
            actual: 0,
        });
    }
    check_len("conv state", state.len(), d * (w - 1))?;
    Ok((w, rows_of("conv x", x_len, d)?))
}

/// The conv scratch holds at least the `hist = W − 1` entries every path needs.
fn check_scratch(len: usize, hist: usize) -> Result<(), KdaError> {
    if len < hist {
        return Err(KdaError::TooSmall {
            arg: "conv scratch",
            needed: hist,
            actual: len,
        });
    }
    Ok(())
}

/// Channels per block of the blocked prefill conv: one 64-byte line of a row.
const CB: usize = 16;

/// Scratch (f32 elements) for [`short_conv_prefill`] at conv width `w`: room to run 16
/// channels at a time (each step reads one cache line per row). It needs only `w − 1`;
/// with less than this it runs one channel at a time (slower, same result bitwise).
pub fn short_conv_prefill_scratch(w: usize) -> usize {
    CB * w.saturating_sub(1)
}

/// Runs the conv over `T` rows of one sequence **in place**: `x` is `[T, d]` raw inputs on
/// entry and activated outputs on return; `weight` is `[d, W]`; `state` `[d, W−1]` is read as
/// the history and replaced by the last `W−1` raw inputs of the stream. `scratch` needs at
/// least `W − 1` elements ([`short_conv_prefill_scratch`] for full speed).
pub fn short_conv_prefill(
    x: &mut [f32],
    d: usize,
    weight: Data<'_>,
    state: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KdaError> {
    let (w, t_len) = check(x.len(), d, &weight, state)?;
    let hist = w - 1;
    check_scratch(scratch.len(), hist)?;
    let cb = if scratch.len() >= CB * hist { CB } else { 1 };
    let mut c0 = 0;
    while c0 < d {
        let nc = (d - c0).min(cb);
        // Stream position j ∈ [−hist, T) of channel c: history for j < 0, raw input otherwise.
        let at = |x: &[f32], state: &[f32], c: usize, j: isize| -> f32 {
            if j < 0 {
                state[c * hist + (hist as isize + j) as usize]
            } else {
                x[j as usize * d + c]
            }
        };
        // The new state is the stream's last `hist` entries: save before overwriting x.
        let tmp = &mut scratch[..nc * hist];
        for (ci, slots) in tmp.chunks_exact_mut(hist.max(1)).enumerate().take(nc) {
            for (i, slot) in slots.iter_mut().enumerate().take(hist) {
                *slot = at(
                    x,
                    state,
                    c0 + ci,
                    t_len as isize - hist as isize + i as isize,
                );
            }
        }
        // Descending t: output t overwrites raw t only after every later output has read it.
        // Each output is `Σ_i w[c,i]·s[t−hist+i]` summed in order of i, then SiLU, whatever the
        // channel block, so the result is bitwise that of the decode step.
        let mut acc = [0.0f32; CB];
        for t in (0..t_len).rev() {
            let acc = &mut acc[..nc];
            acc.fill(0.0);
            for i in 0..w {
                let j = t as isize - hist as isize + i as isize;
                if j >= 0 {
                    let src = &x[j as usize * d + c0..j as usize * d + c0 + nc];
                    for (ci, (a, v)) in acc.iter_mut().zip(src).enumerate() {
                        *a += weight.at((c0 + ci) * w + i) * v;
                    }
                } else {
                    for (ci, a) in acc.iter_mut().enumerate() {
                        *a += weight.at((c0 + ci) * w + i) * at(x, state, c0 + ci, j);
                    }
                }
            }
            for (o, a) in x[t * d + c0..t * d + c0 + nc].iter_mut().zip(acc.iter()) {
                *o = silu(*a);
            }
        }
        for ci in 0..nc {
            let c = c0 + ci;
            state[c * hist..(c + 1) * hist].copy_from_slice(&tmp[ci * hist..(ci + 1) * hist]);
        }
        c0 += nc;
    }
    Ok(())
}

/// [`short_conv_prefill`] on the vector path `isa` (the same chains in the same order, SiLU on
/// the vector `exp`; the portable path is [`short_conv_prefill`] itself). Decode steps (`T` = 1)
/// and prefill give bitwise the same outputs and states on one path, whatever the split.
pub fn short_conv_prefill_with(
    isa: crate::Isa,
    x: &mut [f32],
    d: usize,
    weight: Data<'_>,
    state: &mut [f32],
    scratch: &mut [f32],
) -> Result<(), KdaError> {
    let (w, _) = check(x.len(), d, &weight, state)?;
    check_scratch(scratch.len(), w - 1)?;
    if crate::simd::short_conv(isa, x, d, weight, state) {
        return Ok(());
    }
    short_conv_prefill(x, d, weight, state, scratch)
}

/// One decode step for one token: `x` `[d]` raw in, activated out; `state` `[d, W−1]` shifts
/// left by one and takes the raw input as its newest entry.
pub fn short_conv_step(x: &mut [f32], weight: Data<'_>, state: &mut [f32]) -> Result<(), KdaError> {
    let d = x.len();
    let (w, _) = check(x.len(), d, &weight, state)?;
    let hist = w - 1;
    for c in 0..d {
        let wc = weight.slice(c * w, w);
        let st = &mut state[c * hist..(c + 1) * hist];
        let raw = x[c];
        let mut acc = 0.0f32;
        for (i, s) in st.iter().enumerate() {
            acc += wc.at(i) * s;
        }
        acc += wc.at(hist) * raw;
        if hist > 0 {
            st.copy_within(1.., 0);
            st[hist - 1] = raw;
        }
        x[c] = silu(acc);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn reference(x: &[f32], d: usize, w: &[f32], st: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let k = w.len() / d;
        let t_len = x.len() / d;
        let mut out = std::vec![0.0; x.len()];
        let mut new_st = std::vec![0.0; st.len()];
        for c in 0..d {
            let mut stream: Vec<f64> = st[c * (k - 1)..(c + 1) * (k - 1)]
                .iter()
                .map(|&v| v as f64)
                .collect();
            stream.extend((0..t_len).map(|t| x[t * d + c] as f64));
            for t in 0..t_len {
                let acc: f64 = (0..k).map(|i| w[c * k + i] as f64 * stream[t + i]).sum();
                out[t * d + c] = (acc / (1.0 + (-acc).exp())) as f32;
            }
            for i in 0..k - 1 {
                new_st[c * (k - 1) + i] = stream[stream.len() - (k - 1) + i] as f32;
            }
        }
        (out, new_st)
    }

    /// Inputs `[T, d]`, weights `[d, W]` and a conv state `[d, W−1]` from one LCG seeded with
    /// `seed`, uniform in `[−half, half)`.
    fn inputs((d, w, t_len): (usize, usize, usize), seed: u32, half: f32) -> [Vec<f32>; 3] {
        let mut s = seed;
        let mut r = || {
            s = s.wrapping_mul(1103515245).wrapping_add(12345);
            ((s >> 8) as f32 / (1u32 << 24) as f32) * (2.0 * half) - half
        };
        let x = (0..d * t_len).map(|_| r()).collect();
        let wt = (0..d * w).map(|_| r()).collect();
        let st = (0..d * (w - 1)).map(|_| r()).collect();
        [x, wt, st]
    }

    /// The vector conv on `path` over `x` (initial state `st0`) in calls of `piece` values
    /// (whole tokens): `[outputs, final state]`.
    fn conv_run(
        path: crate::simd::Path,
        (x, st0): (&[f32], &[f32]),
        d: usize,
        weight: Data<'_>,
        piece: usize,
    ) -> [Vec<f32>; 2] {
        let (mut y, mut st) = (x.to_vec(), st0.to_vec());
        for part in y.chunks_mut(piece) {
            assert!(crate::simd::short_conv(path, part, d, weight, &mut st));
        }
        [y, st]
    }

    /// Every vector path: the plain lanes at 4/8/16 give the reference loops' bits; the ISAs
    /// this CPU has are within rounding; on each path, prefill in pieces and token by token
    /// give the same bits as one call.
    #[test]
    fn vector_paths_match_the_reference_loops() {
        use crate::simd::Path;
        let paths = crate::simd::test_paths();
        for &(d, w, t_len) in &[
            (3usize, 4usize, 7usize),
            (16, 4, 5),
            (17, 4, 9),
            (128, 4, 3),
            (5, 1, 4),
            (9, 8, 3),
            (4, 2, 1),
        ] {
            let [x, wt, st0] = inputs((d, w, t_len), 7, 3.0);
            let mut scratch = std::vec![0.0; short_conv_prefill_scratch(w)];
            let (mut want, mut want_st) = (x.clone(), st0.clone());
            short_conv_prefill(&mut want, d, Data::F32(&wt), &mut want_st, &mut scratch).unwrap();
            for &path in &paths {
                let (mut y, mut st) = (x.clone(), st0.clone());
                assert!(crate::simd::short_conv(
                    path,
                    &mut y,
                    d,
                    Data::F32(&wt),
                    &mut st
                ));
                let exact = matches!(path, Path::Lanes(_));
                for (a, b) in y.iter().zip(&want).chain(st.iter().zip(&want_st)) {
                    if exact {
                        assert_eq!(a.to_bits(), b.to_bits(), "{path:?} d={d} w={w}");
                    } else {
                        assert!(
                            (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                            "{path:?} {a} vs {b}"
                        );
                    }
                }
                // Token by token: the same bits as the one call, outputs and state; also with
                // bf16 weights (the one-token path reads them in their own type).
                let wb: std::vec::Vec<half::bf16> =
                    wt.iter().map(|&v| half::bf16::from_f32(v)).collect();
                for weight in [Data::F32(&wt), Data::Bf16(&wb)] {
                    let whole = conv_run(path, (&x, &st0), d, weight, x.len());
                    let steps = conv_run(path, (&x, &st0), d, weight, d);
                    assert!(
                        steps
                            .iter()
                            .flatten()
                            .zip(whole.iter().flatten())
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{path:?} d={d} w={w} {weight:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn prefill_and_steps_match_reference_for_several_widths() {
        for &(d, w, t_len) in &[
            (3usize, 4usize, 7usize),
            (2, 4, 2),
            (5, 1, 4),
            (4, 2, 1),
            (3, 6, 3),
        ] {
            let [x, wt, st0] = inputs((d, w, t_len), 1, 1.0);
            let (want, want_st) = reference(&x, d, &wt, &st0);

            let mut y = x.clone();
            let mut st = st0.clone();
            let mut scratch = std::vec![0.0; short_conv_prefill_scratch(w)];
            short_conv_prefill(&mut y, d, Data::F32(&wt), &mut st, &mut scratch).unwrap();
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() < 1e-6);
            }
            for (a, b) in st.iter().zip(&want_st) {
                assert_eq!(a, b);
            }

            let mut st = st0.clone();
            for t in 0..t_len {
                let mut row = x[t * d..(t + 1) * d].to_vec();
                short_conv_step(&mut row, Data::F32(&wt), &mut st).unwrap();
                for c in 0..d {
                    assert!((row[c] - want[t * d + c]).abs() < 1e-6);
                }
            }
            assert_eq!(st, want_st);
        }
    }

    #[test]
    fn bad_lengths_are_errors() {
        let wt = [0.5f32; 8];
        let mut st = [0.0f32; 5];
        let mut x = [1.0f32; 4];
        let mut scratch = [0.0f32; 3];
        assert!(matches!(
            short_conv_prefill(&mut x, 2, Data::F32(&wt), &mut st, &mut scratch),
            Err(KdaError::Length {
                arg: "conv state",
                ..
            })
        ));
        let mut st = [0.0f32; 6];
        let mut x = [1.0f32; 5];
        assert!(matches!(
            short_conv_prefill(&mut x, 2, Data::F32(&wt), &mut st, &mut scratch),
            Err(KdaError::Length { arg: "conv x", .. })
        ));
        let mut x = [1.0f32; 4];
        assert!(matches!(
            short_conv_prefill(&mut x, 2, Data::F32(&wt), &mut st, &mut scratch[..1]),
            Err(KdaError::TooSmall { .. })
        ));
    }
}
