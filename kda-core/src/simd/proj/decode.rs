//! The decode kernels: up to [`DECODE_PANELS`] 16-row bf16 panels streamed for up to four
//! tokens (f32 inputs, or the bf16 mode's pairs), and up to [`DIRECT`] weight rows read
//! straight from the rows: the safe wrappers and their kernels (tested in `tests.rs`).

use half::bf16;

use super::{PairSteps, Rows};
use crate::error::KdaError;
use crate::simd::types::{DECODE_LD, DECODE_PANELS, DIRECT, PANEL};
use crate::simd::{bad, dispatch, portable, Path};

/// Continues `acc[t·32 + r]` over `k0..k1` straight from up to [`DIRECT`] weight rows (the same
/// sums as [`pack_panel`](super::pack_panel) + [`panel_fma`](super::panel_fma)). A slice too short
/// (a bug) is an [`KdaError::Internal`] error.
pub fn rows_fma(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    ws: Rows<'_, '_>,
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if k0 > k1
        || !ws.ok(k1, DIRECT)
        || acc.len() < xs.len() * DIRECT
        || xs.iter().any(|x| x.len() < k1)
    {
        return bad("simd::rows_fma arguments");
    }
    match ws {
        Rows::F32(w) => dispatch!(
            isa,
            rows_fma(xs, w, k0, k1, acc),
            portable::rows_fma(xs, w, k0, k1, acc, |v| v)
        ),
        Rows::Bf16(w) => dispatch!(
            isa,
            rows_fma(xs, w, k0, k1, acc),
            portable::rows_fma(xs, w, k0, k1, acc, portable::bf16_to_f32)
        ),
    }
    Ok(())
}

/// Continues `acc[t·DECODE_LD + 16p + r]` (`t` < 4 tokens, `p` < [`DECODE_PANELS`]) over `k0..k1`
/// straight from bf16 weights in the panel layout ([`crate::MatRef::new_panels`]; `panels[p]` is
/// one 16-row panel, ≥ `16·k1` long): the same in-order sums as [`pack_panel`](super::pack_panel) +
/// [`panel_fma`](super::panel_fma) of the same rows, bitwise, on each path. A slice too short (a
/// bug) is an [`KdaError::Internal`] error.
pub fn panels_fma(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    panels: &[&[bf16]],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if k0 > k1
        || !(1..=4).contains(&xs.len())
        || !(1..=DECODE_PANELS).contains(&panels.len())
        || panels.iter().any(|p| p.len() < k1 * PANEL)
        || xs.iter().any(|x| x.len() < k1)
        || acc.len() < xs.len() * DECODE_LD
    {
        return bad("simd::panels_fma arguments");
    }
    dispatch!(
        isa,
        panels_fma(xs, panels, k0, k1, acc),
        portable::panels_fma(xs, panels, k0, k1, acc)
    );
    Ok(())
}

/// The bf16 mode's decode: continues `acc[t·DECODE_LD + 16p + r]` (`t` < 4 tokens, `p` <
/// [`DECODE_PANELS`]) with the same chains as [`pairs_panel_fma`](super::pairs_panel_fma), bitwise,
/// on each path. A slice too short (a bug) is an [`KdaError::Internal`] error.
pub fn pairs_panels_fma(
    isa: impl Into<Path>,
    xs: &[&[u32]],
    panels: &[&[bf16]],
    steps: PairSteps,
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if !(1..=4).contains(&xs.len())
        || !(1..=DECODE_PANELS).contains(&panels.len())
        || panels.iter().any(|p| !steps.ok(p.len(), xs))
        || acc.len() < xs.len() * DECODE_LD
    {
        return bad("simd::pairs_panels_fma arguments");
    }
    let st = steps.tuple();
    dispatch!(
        isa,
        pairs_panels_fma(xs, panels, st, acc),
        portable::pairs_panels_fma(xs, panels, st, acc, DECODE_LD)
    );
    Ok(())
}

/// The kernels of this file, generic over the ISA token and `#[inline(always)]` (see the
/// contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use half::bf16;

    use crate::simd::proj::kernels::{pair_rows, pair_split, row_ptrs, MAX_PER_PANEL};
    use crate::simd::types::{DECODE_LD, DECODE_PANELS, DIRECT, PANEL};
    use crate::simd::vector::{column, Elem, Simd};

    /// `$block!(MT, P)` for `(tokens, panels)` of the decode kernels: `P` a power of two, at most
    /// 8 panels for one or two tokens and 4 for more ([`decode_group`] picks it).
    macro_rules! by_tokens_panels {
        ($tp:expr, $block:ident) => {
            match $tp {
                (1, 8) => $block!(1, 8),
                (1, 4) => $block!(1, 4),
                (1, 2) => $block!(1, 2),
                (1, _) => $block!(1, 1),
                (2, 8) => $block!(2, 8),
                (2, 4) => $block!(2, 4),
                (2, 2) => $block!(2, 2),
                (2, _) => $block!(2, 1),
                (3, 4) => $block!(3, 4),
                (3, 2) => $block!(3, 2),
                (3, _) => $block!(3, 1),
                (4, 4) => $block!(4, 4),
                (4, 2) => $block!(4, 2),
                _ => $block!(4, 1),
            }
        };
    }

    /// Steps of one panel a decode kernel reads before it moves to the next panel: 16 bf16 rows,
    /// 512 contiguous bytes. On Zen 4, eight panels read this way reach the read limit of eight
    /// far-apart streams; four panels a row (32 bytes) at a time stayed 10–15 % below it.
    const DECODE_BLOCK: usize = 16;

    /// `$body` once for each panel `$p` in `0..$n` (`$n` ≤ 8, a const generic), written out with
    /// a constant `$p` each time. A loop over the panels whose body holds a loop of its own is not
    /// unrolled by LLVM, and its variable index into the accumulator array keeps every accumulator
    /// in memory (a load and a store around each multiply-add); constant indices keep them in
    /// registers.
    macro_rules! each_panel {
        ($n:expr, $p:ident => $body:expr) => {{
            each_panel!(@ $n, $p, $body, 0 1 2 3 4 5 6 7)
        }};
        (@ $n:expr, $p:ident, $body:expr, $($i:literal)*) => {{
            const _: () = assert!($crate::simd::DECODE_PANELS <= 8);
            $(
                if $i < $n {
                    let $p: usize = $i;
                    $body;
                }
            )*
        }};
    }

    /// Panels a decode kernel streams at once for `tokens` tokens of `remaining` panels: as many
    /// as keep the accumulators within half the registers, at most [`DECODE_PANELS`], a
    /// power of two (8 for one token on AVX-512, 4 on AVX2 and NEON).
    #[inline(always)]
    fn decode_group<S: Simd>(tokens: usize, remaining: usize) -> usize {
        let vp = PANEL / S::LANES;
        let fit = (S::REGISTERS / 2 / vp / tokens.max(1)).clamp(1, DECODE_PANELS);
        let most = fit.min(remaining).max(1);
        1 << most.ilog2()
    }

    /// The decode accumulators of `MT` tokens × `P` panels, `acc[t·DECODE_LD + 16p + r]`, loaded
    /// into registers (`a[p][t][v]`).
    #[inline(always)]
    unsafe fn decode_acc_load<S: Simd, const MT: usize, const P: usize>(
        s: S,
        acc: *const f32,
    ) -> [[[S::F; MAX_PER_PANEL]; MT]; P] {
        let mut a = [[[s.splat(0.0); MAX_PER_PANEL]; MT]; P];
        for (p, a) in a.iter_mut().enumerate() {
            for (t, a) in a.iter_mut().enumerate() {
                for (v, a) in a.iter_mut().enumerate().take(PANEL / S::LANES) {
                    *a = s.load(acc.add(t * DECODE_LD + p * PANEL + v * S::LANES));
                }
            }
        }
        a
    }

    /// Stores what [`decode_acc_load`] loaded.
    #[inline(always)]
    unsafe fn decode_acc_store<S: Simd, const MT: usize, const P: usize>(
        s: S,
        acc: *mut f32,
        a: &[[[S::F; MAX_PER_PANEL]; MT]; P],
    ) {
        for (p, a) in a.iter().enumerate() {
            for (t, a) in a.iter().enumerate() {
                for (v, a) in a.iter().enumerate().take(PANEL / S::LANES) {
                    s.store(acc.add(t * DECODE_LD + p * PANEL + v * S::LANES), *a);
                }
            }
        }
    }

    /// `MT` tokens × `G` vectors of weight rows straight from the row-major weights: each tile
    /// is transposed in registers and consumed at once (no packing, for decode).
    #[inline(always)]
    unsafe fn rows_block<S: Simd, W: Elem, const MT: usize, const G: usize>(
        s: S,
        x: [*const f32; MT],
        rp: &[*const W],
        (k0, k1): (usize, usize),
        acc: *mut f32,
    ) {
        let l = S::LANES;
        let mut a = [[s.splat(0.0); G]; MT];
        for (t, a) in a.iter_mut().enumerate() {
            for (g, a) in a.iter_mut().enumerate() {
                *a = s.load(acc.add(t * DIRECT + g * l));
            }
        }
        let mut k = k0;
        while k + l <= k1 {
            for g in 0..G {
                let tile = s.load_tile(&rp[g * l..], k);
                for j in 0..l {
                    let c = s.tile_col(&tile, j);
                    for (t, a) in a.iter_mut().enumerate() {
                        a[g] = s.mul_add(s.broadcast(x[t].add(k + j)), c, a[g]);
                    }
                }
            }
            k += l;
        }
        while k < k1 {
            for g in 0..G {
                let c = column(s, &rp[g * l..], k);
                for (t, a) in a.iter_mut().enumerate() {
                    a[g] = s.mul_add(s.broadcast(x[t].add(k)), c, a[g]);
                }
            }
            k += 1;
        }
        for (t, a) in a.iter().enumerate() {
            for (g, a) in a.iter().enumerate() {
                s.store(acc.add(t * DIRECT + g * l), *a);
            }
        }
    }

    /// Continues `acc[t·32 + r]` over `k0..k1` straight from up to 32 weight rows. One token
    /// (decode) streams [`Simd::DECODE_ROWS`] rows at a time; more tokens go 16 rows × up to 4
    /// tokens at a time.
    #[inline(always)]
    pub(crate) unsafe fn rows_fma<S: Simd, W: Elem>(
        s: S,
        xs: &[&[f32]],
        ws: &[&[W]],
        k0: usize,
        k1: usize,
        acc: &mut [f32],
    ) {
        let rp: [*const W; DIRECT] = row_ptrs(ws);
        let ap = acc.as_mut_ptr();
        if xs.len() == 1 {
            let (x, step) = ([xs[0].as_ptr()], S::DECODE_ROWS);
            for r in (0..ws.len()).step_by(step) {
                let (rr, a) = (&rp[r..], ap.add(r));
                match step / S::LANES {
                    1 => rows_block::<S, W, 1, 1>(s, x, rr, (k0, k1), a),
                    2 => rows_block::<S, W, 1, 2>(s, x, rr, (k0, k1), a),
                    _ => rows_block::<S, W, 1, 4>(s, x, rr, (k0, k1), a),
                }
            }
            return;
        }
        for r in (0..ws.len()).step_by(16) {
            let rr = &rp[r..];
            for (g, xg) in xs.chunks(4).enumerate() {
                let a = ap.add(g * 4 * DIRECT + r);
                macro_rules! block {
                    ($mt:literal) => {{
                        let x: [*const f32; $mt] = core::array::from_fn(|t| xg[t].as_ptr());
                        match 16 / S::LANES {
                            1 => rows_block::<S, W, $mt, 1>(s, x, rr, (k0, k1), a),
                            2 => rows_block::<S, W, $mt, 2>(s, x, rr, (k0, k1), a),
                            _ => rows_block::<S, W, $mt, 4>(s, x, rr, (k0, k1), a),
                        }
                    }};
                }
                match xg.len() {
                    4 => block!(4),
                    3 => block!(3),
                    2 => block!(2),
                    _ => block!(1),
                }
            }
        }
    }

    /// `MT` tokens × `P` panels of 16 rows straight from bf16 panel-layout weights (element
    /// `(k, r)` of panel `p` at `pp[p] + 16k + r`): [`DECODE_BLOCK`] steps of each panel in turn.
    /// Every output's chain runs over `k` in order, so the sums are those of a one-panel loop.
    #[inline(always)]
    unsafe fn panels_block<S: Simd, const MT: usize, const P: usize>(
        s: S,
        x: [*const f32; MT],
        pp: [*const bf16; P],
        (k0, k1): (usize, usize),
        acc: *mut f32,
    ) {
        let mut a = decode_acc_load::<S, MT, P>(s, acc);
        if S::LANE_FMA {
            // NEON's by-element FMA: every panel per load of the inputs, a row at a time (the
            // 16-step blocks below, eight steps per load of the inputs, cost NEON 8 % more
            // instructions per token, and no ARM machine measured what they gain).
            panel_steps_lanes(s, &x, &pp, (k0, k1), &mut a);
        } else {
            let mut k = k0;
            while k < k1 {
                let kb = (k + DECODE_BLOCK).min(k1);
                if MT == 1 && kb - k == DECODE_BLOCK {
                    // One token: a constant count of steps, written out without a loop (a third
                    // fewer instructions on AVX2). More tokens keep the loop: written out, LLVM
                    // hoists the inputs the panels share, spills them and mixes the panels' reads.
                    let xk: [*const f32; MT] = core::array::from_fn(|t| x[t].add(k));
                    each_panel!(P, p => {
                        let row = pp[p].add(k * PANEL);
                        for i in 0..DECODE_BLOCK {
                            let xi = core::array::from_fn(|t| xk[t].add(i));
                            panel_step(s, &xi, row.add(i * PANEL), &mut a[p]);
                        }
                    });
                } else {
                    each_panel!(P, p => panel_steps(s, &x, pp[p], (k, kb), &mut a[p]));
                }
                k = kb;
            }
        }
        decode_acc_store(s, acc, &a);
    }

    /// [`panels_block`] on a [`Simd::LANE_FMA`] ISA: steps `k0..k1` of every panel, eight steps
    /// per load of each token's next inputs, taken by lane (eight halve the loop's own
    /// instructions; sixteen spill); then [`panel_steps`] for the last few.
    #[inline(always)]
    unsafe fn panel_steps_lanes<S: Simd, const MT: usize, const P: usize>(
        s: S,
        x: &[*const f32; MT],
        pp: &[*const bf16; P],
        (k0, k1): (usize, usize),
        a: &mut [[[S::F; MAX_PER_PANEL]; MT]; P],
    ) {
        debug_assert!(S::LANE_FMA && S::LANES == 4);
        let mut k = k0;
        while k + 8 <= k1 {
            // `k + 8 ≤ k1`, and LANE_FMA implies LANES == 4.
            let (mut xq, mut xr) = ([s.splat(0.0); MT], [s.splat(0.0); MT]);
            for t in 0..MT {
                xq[t] = s.load(x[t].add(k));
                xr[t] = s.load(x[t].add(k + 4));
            }
            panels_lane_step::<S, MT, P, 0>(s, &xq, pp, k, a);
            panels_lane_step::<S, MT, P, 1>(s, &xq, pp, k + 1, a);
            panels_lane_step::<S, MT, P, 2>(s, &xq, pp, k + 2, a);
            panels_lane_step::<S, MT, P, 3>(s, &xq, pp, k + 3, a);
            panels_lane_step::<S, MT, P, 0>(s, &xr, pp, k + 4, a);
            panels_lane_step::<S, MT, P, 1>(s, &xr, pp, k + 5, a);
            panels_lane_step::<S, MT, P, 2>(s, &xr, pp, k + 6, a);
            panels_lane_step::<S, MT, P, 3>(s, &xr, pp, k + 7, a);
            k += 8;
        }
        each_panel!(P, p => panel_steps(s, x, pp[p], (k, k1), &mut a[p]));
    }

    /// Steps `k0..k1` of one bf16 panel for every token of [`panels_block`].
    #[inline(always)]
    unsafe fn panel_steps<S: Simd, const MT: usize>(
        s: S,
        x: &[*const f32; MT],
        panel: *const bf16,
        (k0, k1): (usize, usize),
        a: &mut [[S::F; MAX_PER_PANEL]; MT],
    ) {
        debug_assert!(!S::LANE_FMA || S::LANES == 4);
        let mut k = k0;
        if S::LANE_FMA {
            // Four steps per load of each token's next inputs, taken by lane.
            while k + 4 <= k1 {
                // `k + 4 ≤ k1`, and LANE_FMA implies LANES == 4.
                let mut xq = [s.splat(0.0); MT];
                for (xq, x) in xq.iter_mut().zip(x) {
                    *xq = s.load(x.add(k));
                }
                panel_lane_step::<S, MT, 0>(s, &xq, panel.add(k * PANEL), a);
                panel_lane_step::<S, MT, 1>(s, &xq, panel.add((k + 1) * PANEL), a);
                panel_lane_step::<S, MT, 2>(s, &xq, panel.add((k + 2) * PANEL), a);
                panel_lane_step::<S, MT, 3>(s, &xq, panel.add((k + 3) * PANEL), a);
                k += 4;
            }
        }
        for k in k..k1 {
            let xk = core::array::from_fn(|t| x[t].add(k));
            panel_step(s, &xk, panel.add(k * PANEL), a);
        }
    }

    /// One step of one bf16 panel for every token: the panel row at `row` times each token's
    /// input at `x[t]`. (Pointers to the step itself, not a step index: LLVM then addresses the
    /// steps of a written-out block by constant offsets instead of keeping an index per step.)
    #[inline(always)]
    unsafe fn panel_step<S: Simd, const MT: usize>(
        s: S,
        x: &[*const f32; MT],
        row: *const bf16,
        a: &mut [[S::F; MAX_PER_PANEL]; MT],
    ) {
        let b = panel_row(s, row);
        for (a, x) in a.iter_mut().zip(x) {
            let xv = s.broadcast(*x);
            for v in 0..PANEL / S::LANES {
                a[v] = s.mul_add(xv, b[v], a[v]);
            }
        }
    }

    /// Row `k` of a bf16 panel (16 values) as `PANEL / LANES` vectors, widened in pairs.
    #[inline(always)]
    unsafe fn panel_row<S: Simd>(s: S, p: *const bf16) -> [S::F; MAX_PER_PANEL] {
        let mut b = [s.splat(0.0); MAX_PER_PANEL];
        let vp = PANEL / S::LANES;
        if vp == 1 {
            b[0] = s.load_bf16(p);
        } else {
            for v in (0..vp).step_by(2) {
                (b[v], b[v + 1]) = s.load_bf16_pair(p.add(v * S::LANES));
            }
        }
        b
    }

    /// One panel row (at `row`) times lane `J` of each token's `xq` (the [`Simd::LANE_FMA`] path
    /// of [`panel_steps`]: the same multiply-adds in the same order as its broadcast path).
    #[inline(always)]
    unsafe fn panel_lane_step<S: Simd, const MT: usize, const J: i32>(
        s: S,
        xq: &[S::F; MT],
        row: *const bf16,
        a: &mut [[S::F; MAX_PER_PANEL]; MT],
    ) {
        let b = panel_row(s, row);
        for (a, xq) in a.iter_mut().zip(xq) {
            for v in 0..PANEL / S::LANES {
                a[v] = s.mul_add_lane::<J>(*xq, b[v], a[v]);
            }
        }
    }

    /// Step `k` of every panel times lane `J` of each token's `xq` (panels written out by
    /// `each_panel!`, so every accumulator stays in a register).
    #[inline(always)]
    unsafe fn panels_lane_step<S: Simd, const MT: usize, const P: usize, const J: i32>(
        s: S,
        xq: &[S::F; MT],
        pp: &[*const bf16; P],
        k: usize,
        a: &mut [[[S::F; MAX_PER_PANEL]; MT]; P],
    ) {
        each_panel!(P, p => panel_lane_step::<S, MT, J>(s, xq, pp[p].add(k * PANEL), &mut a[p]));
    }

    /// Continues `acc[t·DECODE_LD + 16p + r]` over `k0..k1` for up to 4 tokens × up to
    /// [`DECODE_PANELS`] panels, streamed in groups of [`decode_group`] panels.
    #[inline(always)]
    pub(crate) unsafe fn panels_fma<S: Simd>(
        s: S,
        xs: &[&[f32]],
        panels: &[&[bf16]],
        k0: usize,
        k1: usize,
        acc: &mut [f32],
    ) {
        let ap = acc.as_mut_ptr();
        let mut p0 = 0;
        while p0 < panels.len() {
            let np = decode_group::<S>(xs.len(), panels.len() - p0);
            let a = ap.add(p0 * PANEL);
            macro_rules! block {
                ($mt:literal, $p:literal) => {{
                    let x: [*const f32; $mt] = core::array::from_fn(|t| xs[t].as_ptr());
                    let pp: [*const bf16; $p] = core::array::from_fn(|p| panels[p0 + p].as_ptr());
                    panels_block::<S, $mt, $p>(s, x, pp, (k0, k1), a)
                }};
            }
            by_tokens_panels!((xs.len(), np), block);
            p0 += np;
        }
    }

    /// Pair `j` of a bf16 panel (steps `2j` at `lo` and `2j + 1` at `hi`, 16 values each) as
    /// `PANEL / LANES` pair vectors.
    #[inline(always)]
    unsafe fn pairs_row<S: Simd>(s: S, lo: *const bf16, hi: *const bf16) -> [S::P; MAX_PER_PANEL] {
        let mut b = [s.load_pairs(lo, hi); MAX_PER_PANEL];
        for (v, b) in b.iter_mut().enumerate().take(PANEL / S::LANES).skip(1) {
            *b = s.load_pairs(lo.add(v * S::LANES), hi.add(v * S::LANES));
        }
        b
    }

    /// Pair `j` (its weight rows `lo`, `hi`) of the decode's [`pairs_panels_block`] for every
    /// token.
    #[inline(always)]
    unsafe fn pairs_step<S: Simd, const MT: usize>(
        s: S,
        x: &[*const u32; MT],
        j: usize,
        (lo, hi): (*const bf16, *const bf16),
        a: &mut [[S::F; MAX_PER_PANEL]; MT],
    ) {
        let b = pairs_row(s, lo, hi);
        for (t, a) in a.iter_mut().enumerate() {
            let xv = s.broadcast_pair(x[t].add(j));
            for v in 0..PANEL / S::LANES {
                a[v] = s.dot_pairs(a[v], b[v], xv);
            }
        }
    }

    /// `MT` tokens × `P` panels of the bf16-pairs GEMM over pairs `j0..j1` (decode: every weight
    /// read once per step), [`DECODE_BLOCK`] steps of each panel in turn. The same chains as
    /// `pairs_block`.
    #[inline(always)]
    unsafe fn pairs_panels_block<S: Simd, const MT: usize, const P: usize>(
        s: S,
        x: [*const u32; MT],
        pp: [*const bf16; P],
        (j0, j1, n): (usize, usize, usize),
        acc: *mut f32,
    ) {
        let mut a = decode_acc_load::<S, MT, P>(s, acc);
        let (full, tail) = pair_split((j0, j1, n));
        const PAIRS: usize = DECODE_BLOCK / 2;
        let mut j = full.start;
        while j < full.end {
            if j + PAIRS <= full.end {
                // A constant count of pairs, so that LLVM writes the block out without a loop.
                each_panel!(P, p => for j in j..j + PAIRS {
                    pairs_step(s, &x, j, pair_rows(pp[p], j, false), &mut a[p]);
                });
                j += PAIRS;
            } else {
                each_panel!(P, p => for j in j..full.end {
                    pairs_step(s, &x, j, pair_rows(pp[p], j, false), &mut a[p]);
                });
                j = full.end;
            }
        }
        for j in tail {
            each_panel!(P, p => pairs_step(s, &x, j, pair_rows(pp[p], j, true), &mut a[p]));
        }
        decode_acc_store(s, acc, &a);
    }

    /// Continues `acc[t·DECODE_LD + 16p + r]` over pairs `j0..j1` for up to 4 tokens × up to
    /// [`DECODE_PANELS`] bf16 panels of `n` steps (the bf16 mode's decode; the same chains as
    /// [`pairs_panel_fma`](crate::simd::pairs_panel_fma)), streamed in groups of [`decode_group`]
    /// panels.
    #[inline(always)]
    pub(crate) unsafe fn pairs_panels_fma<S: Simd>(
        s: S,
        xs: &[&[u32]],
        panels: &[&[bf16]],
        (j0, j1, n): (usize, usize, usize),
        acc: &mut [f32],
    ) {
        let ap = acc.as_mut_ptr();
        let mut p0 = 0;
        while p0 < panels.len() {
            let np = decode_group::<S>(xs.len(), panels.len() - p0);
            let a = ap.add(p0 * PANEL);
            macro_rules! block {
                ($mt:literal, $p:literal) => {{
                    let x: [*const u32; $mt] = core::array::from_fn(|t| xs[t].as_ptr());
                    let pp: [*const bf16; $p] = core::array::from_fn(|p| panels[p0 + p].as_ptr());
                    pairs_panels_block::<S, $mt, $p>(s, x, pp, (j0, j1, n), a)
                }};
            }
            by_tokens_panels!((xs.len(), np), block);
            p0 += np;
        }
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn rows_fma<W: $crate::simd::vector::Elem>(
                xs: &[&[f32]],
                ws: &[&[W]],
                k0: usize,
                k1: usize,
                acc: &mut [f32],
            ) {
                $crate::simd::proj::decode::kernels::rows_fma($token, xs, ws, k0, k1, acc)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn panels_fma(
                xs: &[&[f32]],
                panels: &[&[half::bf16]],
                k0: usize,
                k1: usize,
                acc: &mut [f32],
            ) {
                $crate::simd::proj::decode::kernels::panels_fma($token, xs, panels, k0, k1, acc)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn pairs_panels_fma(
                xs: &[&[u32]],
                panels: &[&[half::bf16]],
                steps: (usize, usize, usize),
                acc: &mut [f32],
            ) {
                $crate::simd::proj::decode::kernels::pairs_panels_fma($token, xs, panels, steps, acc)
            }
        };
    }
    pub(crate) use entry_points;
}

crate::simd::instantiate!();
