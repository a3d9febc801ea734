//! The short causal depthwise conv + SiLU of [`crate::ops::conv`] on the vector paths: the
//! safe wrapper and its kernels (tested against the reference loops in `ops/conv.rs`).

use super::{dispatch, Path};

/// The short causal conv + SiLU of [`crate::ops::conv`] on the path's vectors, when the path
/// has them: returns `false`, having done nothing, on the reference path, for more than
/// 8 taps, or when the lengths do not fit (the caller then runs its reference loops).
pub fn short_conv(
    isa: impl Into<Path>,
    x: &mut [f32],
    d: usize,
    weight: crate::weights::Data<'_>,
    state: &mut [f32],
) -> bool {
    let w = weight.len() / d.max(1);
    let fits = d > 0
        && (1..=kernels::MAX_TAPS).contains(&w)
        && weight.len() == d * w
        && x.len().is_multiple_of(d)
        && state.len() == d * (w - 1);
    if !fits {
        return false;
    }
    dispatch!(isa, short_conv(x, d, weight, state), false)
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use crate::simd::elementwise::kernels::silu;
    use crate::simd::vector::{load_upto, store_upto, Elem, Simd, MAX_LANES};

    /// Most taps the vector short conv takes (Kimi's convs have 4); wider ones run the reference.
    pub(crate) const MAX_TAPS: usize = 8;

    /// The short causal depthwise conv + SiLU of `ops::conv` (same contract: `x` `[T, d]` raw in,
    /// activated out, in place; `weight` `[d, W]`; `state` `[d, W−1]` oldest first, replaced by
    /// the stream's last `W−1` raw inputs), `LANES` channels at a time. Each output is the chain
    /// `Σ_i w[c,i]·s[t−(W−1)+i]` in order of `i`, then `x / (1 + e^{−x})`, as the reference.
    #[inline(always)]
    pub(crate) unsafe fn short_conv<S: Simd>(
        s: S,
        x: &mut [f32],
        d: usize,
        weight: crate::weights::Data<'_>,
        state: &mut [f32],
    ) {
        let (l, w) = (S::LANES, weight.len() / d);
        let (hist, t_len, xp) = (w - 1, x.len() / d, x.as_mut_ptr());
        if t_len == 1 {
            use crate::weights::Data;
            // One token (decode): the weights read in their own type, no per-element dispatch.
            match weight {
                Data::F32(ws) => return conv_token(s, x, ws, state),
                Data::Bf16(ws) => return conv_token(s, x, ws, state),
                _ => {}
            }
        }
        let mut c0 = 0;
        while c0 < d {
            let nc = (d - c0).min(l);
            // Tap-major weights and time-major history of the block's channels.
            let mut taps = [[0.0f32; MAX_LANES]; MAX_TAPS];
            let mut old = [[0.0f32; MAX_LANES]; MAX_TAPS];
            for ci in 0..nc {
                let c = c0 + ci;
                for (i, t) in taps.iter_mut().enumerate().take(w) {
                    t[ci] = weight.at(c * w + i);
                }
                for (j, o) in old.iter_mut().enumerate().take(hist) {
                    o[ci] = state[c * hist + j];
                }
            }
            // The new history (the stream's last `hist` raw entries), before x is overwritten.
            let mut new = [[0.0f32; MAX_LANES]; MAX_TAPS];
            for (j, n) in new.iter_mut().enumerate().take(hist) {
                let pos = (t_len + j) as isize - hist as isize;
                for (ci, v) in n.iter_mut().enumerate().take(nc) {
                    *v = match usize::try_from(pos) {
                        Ok(p) => *xp.add(p * d + c0 + ci),
                        Err(_) => old[(hist as isize + pos) as usize][ci],
                    };
                }
            }
            let mut tv = [s.splat(0.0); MAX_TAPS];
            for (v, t) in tv.iter_mut().zip(&taps).take(w) {
                *v = s.load(t.as_ptr());
            }
            // Descending t: output t overwrites raw t only after every later output has read it.
            for t in (0..t_len).rev() {
                let mut acc = s.splat(0.0);
                for (i, tap) in tv.iter().enumerate().take(w) {
                    let v = match usize::try_from((t + i) as isize - hist as isize) {
                        Ok(j) => load_upto(s, xp.add(j * d + c0), nc),
                        Err(_) => s.load(old[t + i].as_ptr()),
                    };
                    acc = s.mul_add(*tap, v, acc);
                }
                store_upto(s, xp.add(t * d + c0), nc, silu(s, acc));
            }
            for (ci, c) in (c0..c0 + nc).enumerate() {
                for (j, n) in new.iter().enumerate().take(hist) {
                    state[c * hist + j] = n[ci];
                }
            }
            c0 += nc;
        }
    }

    /// [`short_conv`] for one token (`x` `[d]`), `LANES` channels at a time: the same chain per
    /// output (`Σ_i w[c,i]·s_i` in order of `i`, the token last), the history shifted by one in
    /// place. With `LANES` taps, a block's taps and history come from one tile load each (its
    /// rows are the channels); otherwise they are gathered one value at a time.
    #[inline(always)]
    unsafe fn conv_token<S: Simd, W: Elem>(s: S, x: &mut [f32], weight: &[W], state: &mut [f32]) {
        let (l, d) = (S::LANES, x.len());
        let w = weight.len() / d;
        let hist = w - 1;
        let (xp, wp, sp) = (x.as_mut_ptr(), weight.as_ptr(), state.as_mut_ptr());
        let mut c0 = 0;
        while c0 < d {
            let nc = (d - c0).min(l);
            let xv = load_upto(s, xp.add(c0), nc);
            // A history tile reads one value past the block's last row: only before the last block.
            let acc = if w == l && nc == l && c0 + l < d {
                let wr: [*const W; MAX_LANES] =
                    core::array::from_fn(|i| wp.add((c0 + i.min(l - 1)) * w));
                let sr: [*const f32; MAX_LANES] =
                    core::array::from_fn(|i| sp.add((c0 + i.min(l - 1)) * hist) as *const f32);
                let (wt, st) = (s.load_tile(&wr, 0), s.load_tile(&sr, 0));
                let mut acc = s.splat(0.0);
                for i in 0..S::LANES {
                    let v = if i < S::LANES - 1 {
                        s.tile_col(&st, i)
                    } else {
                        xv
                    };
                    acc = s.mul_add(s.tile_col(&wt, i), v, acc);
                }
                acc
            } else {
                conv_gathered(s, (wp, w), sp, (c0, nc), xv)
            };
            shift_history(sp, (c0, nc), hist, xp);
            store_upto(s, xp.add(c0), nc, silu(s, acc));
            c0 += nc;
        }
    }

    /// One block's conv chain with its taps and history gathered one value at a time.
    #[inline(always)]
    unsafe fn conv_gathered<S: Simd, W: Elem>(
        s: S,
        (wp, w): (*const W, usize),
        sp: *const f32,
        (c0, nc): (usize, usize),
        xv: S::F,
    ) -> S::F {
        let hist = w - 1;
        let mut buf = [0.0f32; MAX_LANES];
        let mut acc = s.splat(0.0);
        for i in 0..w {
            for (ci, b) in buf.iter_mut().enumerate().take(nc) {
                *b = (*wp.add((c0 + ci) * w + i)).widen();
            }
            let tap = s.load(buf.as_ptr());
            let v = if i < hist {
                for (ci, b) in buf.iter_mut().enumerate().take(nc) {
                    *b = *sp.add((c0 + ci) * hist + i);
                }
                s.load(buf.as_ptr())
            } else {
                xv
            };
            acc = s.mul_add(tap, v, acc);
        }
        acc
    }

    /// The histories `[hist]` of channels `c0..c0 + nc` (rows of `state`) shifted by one, the
    /// channel's input `x[c]` appended.
    #[inline(always)]
    unsafe fn shift_history(state: *mut f32, (c0, nc): (usize, usize), hist: usize, x: *const f32) {
        for c in c0..c0 + nc {
            let row = state.add(c * hist);
            if hist == 3 {
                // Kimi's 4-tap convs, without a loop.
                *row = *row.add(1);
                *row.add(1) = *row.add(2);
                *row.add(2) = *x.add(c);
            } else if hist > 0 {
                for j in 1..hist {
                    *row.add(j - 1) = *row.add(j);
                }
                *row.add(hist - 1) = *x.add(c);
            }
        }
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn short_conv(
                x: &mut [f32],
                d: usize,
                weight: $crate::weights::Data<'_>,
                state: &mut [f32],
            ) -> bool {
                $crate::simd::conv::kernels::short_conv($token, x, d, weight, state);
                true
            }
        };
    }
    pub(crate) use entry_points;
}

super::instantiate!();
