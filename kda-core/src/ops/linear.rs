//! Projections: `out[t, o] = Σ_i x[t, i] · W[o, i]` with `W` in checkpoint layout `[out, in]`.
//!
//! Accumulation is in f32 with eight independent partial sums (a fixed order, so every call
//! with the same inputs gives bitwise the same answer, and the compiler vectorises the loop).

use half::{bf16, f16};

use crate::error::{check_len, KdaError};
use crate::simd::{self, Isa};
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
        Data::I8 { data, scales } => crate::quant::dot_i8(x, data, scales),
    }
}

/// f32 elements of accumulator scratch that lets [`project_tile`] keep 16 weight rows × 24
/// tokens in flight (its best blocking); any multiple of 96 down to 96 also works.
pub const PROJECT_SCRATCH: usize = 32 * 96;

/// Reduction elements per k-block: the tile's weight rows (16 × 1 KB in f32) and a token
/// group's inputs stay in L1 while the lane accumulators persist in `scratch` between blocks.
const KB: usize = 1024;

/// Computes weight rows `o0..o1` of `x · Wᵀ` for `tokens` input rows (`row(t)` gives row `t`,
/// at least `W.cols` long) and hands each value to `store(t, o, v)`.
///
/// Register blocks of 3 tokens × 4 weight rows, each (token, row) an 8-lane FMA chain over
/// the reduction; the reduction is cut into k-blocks of 256 with the lane accumulators parked
/// in `scratch` (≥ 96 elements; [`PROJECT_SCRATCH`] for full speed) between blocks. Every
/// value is bitwise the same for any `o0..o1` split, any `tokens`, and any scratch size, so
/// decode and prefill, and any thread count, agree exactly. Returns false if a row or the
/// scratch is too short (an internal bug).
#[allow(clippy::too_many_arguments)]
pub fn project_tile<'x>(
    isa: Isa,
    row: &dyn Fn(usize) -> &'x [f32],
    tokens: usize,
    w: &MatRef<'_>,
    o0: usize,
    o1: usize,
    scratch: &mut [f32],
    store: &mut dyn FnMut(usize, usize, f32),
) -> bool {
    let slots = scratch.len() / 96;
    if slots == 0 {
        return false;
    }
    let n = w.cols();
    let kfull = n / 8 * 8;
    let mut out = [[0.0f32; 4]; 3];
    // Token groups of 3 (up to 8 per block), then as many row groups of 4 as the scratch holds.
    let groups_t = tokens.div_ceil(3).clamp(1, 8);
    // One token group (decode): nothing to reuse across row groups, so one row group at a time
    // keeps four sequential weight streams for the prefetchers.
    let groups_o = if tokens <= 3 {
        1
    } else {
        (slots / groups_t).clamp(1, o1.saturating_sub(o0).div_ceil(4).max(1))
    };
    let groups_t = groups_t.min(slots);
    let generic = !matches!(w.data(), Data::F32(_) | Data::Bf16(_));
    let mut oa = o0;
    while oa < o1 {
        let ob = (oa + 4 * groups_o).min(o1);
        let mut ta = 0;
        while ta < tokens {
            let tb = (ta + 3 * groups_t).min(tokens);
            if generic {
                for o in oa..ob {
                    for t in ta..tb {
                        store(t, o, dot(row(t), w.row(o)));
                    }
                }
                ta = tb;
                continue;
            }
            let mut xs: [&[f32]; 24] = [&[]; 24];
            for (i, x) in xs.iter_mut().enumerate().take(tb - ta) {
                *x = row(ta + i);
            }
            let xs = &xs[..tb - ta];
            let per_o = 96 * (tb - ta).div_ceil(3);
            scratch[..per_o * (ob - oa).div_ceil(4)].fill(0.0);
            let mut k0 = 0;
            while k0 < kfull {
                let k1 = (k0 + KB).min(kfull);
                let (mut o, mut go) = (oa, 0);
                while o < ob {
                    let mr = (ob - o).min(4);
                    let Some(ws) = rows_of(w, o, mr) else {
                        return false;
                    };
                    let accs = &mut scratch[go * per_o..(go + 1) * per_o];
                    if !simd::dot_partial_tokens(isa, k0, k1, xs, ws.prefix(mr), accs) {
                        return false;
                    }
                    o += mr;
                    go += 1;
                }
                k0 = k1;
            }
            let (mut o, mut go) = (oa, 0);
            while o < ob {
                let mr = (ob - o).min(4);
                let Some(ws) = rows_of(w, o, mr) else {
                    return false;
                };
                for (g, xg) in xs.chunks(3).enumerate() {
                    let Some(acc) = slot_of(scratch, go * per_o / 96 + g) else {
                        return false;
                    };
                    if !simd::dot_finish(isa, kfull, n, xg, ws.prefix(mr), acc, &mut out) {
                        return false;
                    }
                    for (i, r) in out.iter().enumerate().take(xg.len()) {
                        for (j, v) in r.iter().enumerate().take(mr) {
                            store(ta + 3 * g + i, o + j, *v);
                        }
                    }
                }
                o += mr;
                go += 1;
            }
            ta = tb;
        }
        oa = ob;
    }
    true
}

/// Up to four weight rows as typed slices.
enum RowSet<'w> {
    F32([&'w [f32]; 4]),
    Bf16([&'w [bf16]; 4]),
}

impl<'w> RowSet<'w> {
    fn prefix(&self, mr: usize) -> simd::Rows<'_, 'w> {
        match self {
            RowSet::F32(r) => simd::Rows::F32(&r[..mr]),
            RowSet::Bf16(r) => simd::Rows::Bf16(&r[..mr]),
        }
    }
}

/// Rows `o..o+mr` of `w` (the last repeated to fill four).
fn rows_of<'w>(w: &MatRef<'w>, o: usize, mr: usize) -> Option<RowSet<'w>> {
    let pick = |j: usize| o + j.min(mr.max(1) - 1);
    match w.data() {
        Data::F32(_) => {
            let mut r: [&[f32]; 4] = [&[]; 4];
            for (j, slot) in r.iter_mut().enumerate() {
                let Data::F32(s) = w.row(pick(j)) else {
                    return None;
                };
                *slot = s;
            }
            Some(RowSet::F32(r))
        }
        Data::Bf16(_) => {
            let mut r: [&[bf16]; 4] = [&[]; 4];
            for (j, slot) in r.iter_mut().enumerate() {
                let Data::Bf16(s) = w.row(pick(j)) else {
                    return None;
                };
                *slot = s;
            }
            Some(RowSet::Bf16(r))
        }
        _ => None,
    }
}

/// Accumulator slot `slot` of the scratch.
fn slot_of(scratch: &mut [f32], slot: usize) -> Option<&mut simd::LaneAcc> {
    scratch.get_mut(slot * 96..(slot + 1) * 96)?.try_into().ok()
}

/// `out = x · Wᵀ` for `rows` input rows: `x` is `[rows, W.cols]`, `out` is `[rows, W.rows]`.
pub fn linear(x: &[f32], w: &MatRef<'_>, out: &mut [f32]) -> Result<(), KdaError> {
    linear_with(Isa::detect(), x, w, out)
}

/// [`linear`] on a chosen kernel path.
pub fn linear_with(isa: Isa, x: &[f32], w: &MatRef<'_>, out: &mut [f32]) -> Result<(), KdaError> {
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
    let row = |t: usize| &x[t * n_in..(t + 1) * n_in];
    let mut scratch = [0.0f32; 4 * 96];
    let ok = project_tile(
        isa,
        &row,
        rows,
        w,
        0,
        n_out,
        &mut scratch,
        &mut |t, o, v| out[t * n_out + o] = v,
    );
    if ok {
        Ok(())
    } else {
        Err(KdaError::Internal { what: "projection" })
    }
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
