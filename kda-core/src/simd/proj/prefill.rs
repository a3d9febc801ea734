//! The prefill GEMMs: a panel of 16 weight rows (packed from f32 or bf16 rows, or read in the
//! bf16 panel layout) reused by every token of a register block, and the bf16 mode's pair
//! form: the safe wrappers and their kernels (tested in `tests.rs`).

use half::bf16;

use super::{PairSteps, Rows};
use crate::error::KdaError;
use crate::simd::types::PANEL;
use crate::simd::{bad, dispatch, portable, Path};

/// Projection kernels. Each output of a tile is one chain over the reduction in order,
/// `acc ← acc + x[k]·W[r][k]` (a fused multiply-add on the FMA paths, multiply then add on the
/// portable one), continued across calls through `acc[t·16 + r]` (`r` < the tile's row count).
/// [`pack_panel`] + [`panel_fma`] (prefill: the panel is reused by every token) and
/// [`rows_fma`](super::rows_fma) (decode: straight from the rows) give bitwise the same sums on one
/// path, and so do any k-blocking and any grouping of tokens or rows: decode and prefill, on any
/// number of threads, agree exactly.
///
/// Packs `W[r][k]` for `k0 ≤ k < k1` as `panel[(k − k0)·16 + r]`, widened to f32 (rows past the
/// tile's last repeat it). A slice too short for the shape (a bug) is an [`KdaError::Internal`]
/// error, with nothing done.
pub fn pack_panel(
    isa: impl Into<Path>,
    ws: Rows<'_, '_>,
    k0: usize,
    k1: usize,
    panel: &mut [f32],
) -> Result<(), KdaError> {
    if k0 > k1 || !ws.ok(k1, PANEL) || panel.len() < (k1 - k0) * PANEL {
        return bad("simd::pack_panel arguments");
    }
    match ws {
        Rows::F32(w) => dispatch!(
            isa,
            pack_panel(w, k0, k1, panel),
            portable::pack_panel(w, k0, k1, panel, |v| v)
        ),
        Rows::Bf16(w) => dispatch!(
            isa,
            pack_panel(w, k0, k1, panel),
            portable::pack_panel(w, k0, k1, panel, portable::bf16_to_f32)
        ),
    }
    Ok(())
}

/// Continues `acc[t·16 + r]` over `k0..k1` for every token row `xs[t]` (each ≥ `k1` long)
/// from a panel packed by [`pack_panel`] for the same `k0..k1`. A slice too short (a bug) is
/// an [`KdaError::Internal`] error.
pub fn panel_fma(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    k0: usize,
    k1: usize,
    panel: &[f32],
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if !(steps_ok(xs, (k0, k1), panel.len()) && group_acc_ok(xs.len(), 1, (acc.len(), PANEL))) {
        return bad("simd::panel_fma arguments");
    }
    dispatch!(
        isa,
        panel_fma(xs, (k0, k1), &[panel], (acc, PANEL), &[]),
        portable::panel_fma(xs, k0, k1, panel, acc)
    );
    Ok(())
}

/// Whether token rows `xs` reach step `k1` and a panel of `panel_len` elements holds steps
/// `k0..k1` (`k0 ≤ k1`).
fn steps_ok(xs: &[&[f32]], (k0, k1): (usize, usize), panel_len: usize) -> bool {
    k0 <= k1 && panel_len >= (k1 - k0) * PANEL && xs.iter().all(|x| x.len() >= k1)
}

/// [`panel_fma`] straight from bf16 panels of the panel layout, widened as they are loaded:
/// continues `acc[t·ld + 16p + r]` over `k0..k1` for each panel `p` of `panels` (each
/// starting at step `k0`, element `(k, r)` at `16·(k − k0) + r`): the same sums, bitwise,
/// without a widened copy. A slice too short or `ld` under `16·panels.len()` (a bug) is an
/// [`KdaError::Internal`] error. `ahead`, if it holds a slice of at least `k1 − k0` steps per
/// panel (else it is ignored), is prefetched into L2 while the first register block of tokens
/// runs, a line every step or two (the prefill's next group of panels; results do not depend
/// on it).
pub fn panel_fma_bf16(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    (k0, k1): (usize, usize),
    panels: &[&[bf16]],
    (acc, ld): (&mut [f32], usize),
    ahead: &[&[bf16]],
) -> Result<(), KdaError> {
    let shortest = panels.iter().map(|p| p.len()).min().unwrap_or(usize::MAX);
    if !(steps_ok(xs, (k0, k1), shortest) && group_acc_ok(xs.len(), panels.len(), (acc.len(), ld)))
    {
        return bad("simd::panel_fma_bf16 arguments");
    }
    let _ = ahead; // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(
        isa,
        panel_fma(xs, (k0, k1), panels, (acc, ld), ahead),
        for (p, panel) in panels.iter().enumerate() {
            let a = &mut acc[p * PANEL..];
            portable::panel_fma_bf16(xs, k0, k1, panel, a, ld)
        }
    );
    Ok(())
}

/// Whether accumulators of `acc_len` elements hold `acc[t·ld + 16p + r]` for `tokens` tokens
/// and `panels` panels, tokens `ld ≥ 16·panels` apart (the prefill GEMMs' layout).
fn group_acc_ok(tokens: usize, panels: usize, (acc_len, ld): (usize, usize)) -> bool {
    let width = panels * PANEL;
    let need = match tokens {
        0 => 0,
        m => (m - 1).saturating_mul(ld).saturating_add(width),
    };
    ld >= width && acc_len >= need
}

/// The bf16 precision mode's prefill GEMM: for each panel `p` of `panels` (bf16, the panel layout,
/// from step 0), continues `acc[t·ld + 16p + r]` over pairs `steps.j0..steps.j1` for token rows of
/// bf16 pairs (from [`round_pairs_row`](super::round_pairs_row)): per output the chain
/// `acc ← acc + x_odd·w_odd + x_even·w_even` over the pairs in order, each addition rounded
/// (`vdpbf16ps` on [`Isa::Avx512Bf16`](crate::Isa::Avx512Bf16), two multiply-adds elsewhere:
/// bitwise the same except that `vdpbf16ps` flushes subnormals). A slice too short or `ld` under
/// `16·panels.len()` (a bug) is an [`KdaError::Internal`] error. `ahead` (one slice per panel from
/// pair `j0`, or empty) is prefetched as [`panel_fma_bf16`]'s is; the results do not depend on it.
pub fn pairs_panel_fma(
    isa: impl Into<Path>,
    xs: &[&[u32]],
    steps: PairSteps,
    panels: &[&[bf16]],
    (acc, ld): (&mut [f32], usize),
    ahead: &[&[bf16]],
) -> Result<(), KdaError> {
    if panels.iter().any(|p| !steps.ok(p.len(), xs))
        || !group_acc_ok(xs.len(), panels.len(), (acc.len(), ld))
    {
        return bad("simd::pairs_panel_fma arguments");
    }
    let st = steps.tuple();
    let _ = ahead; // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(
        isa,
        pairs_panel_fma(xs, st, panels, (acc, ld), ahead),
        portable::pairs_panels_fma(xs, panels, st, acc, ld)
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

    use crate::simd::prefetch::prefetch_line;
    use crate::simd::proj::kernels::{pair_rows, pair_split, row_ptrs};
    use crate::simd::types::PANEL;
    use crate::simd::vector::{column, Elem, Simd};

    /// `panel[(k − k0)·16 + r] = W[r][k]` for `k0 ≤ k < k1` (rows past the last repeat it):
    /// tiles transposed in registers, bf16 widened on the way, one column at a time at the end.
    #[inline(always)]
    pub(crate) unsafe fn pack_panel<S: Simd, W: Elem>(
        s: S,
        ws: &[&[W]],
        k0: usize,
        k1: usize,
        panel: &mut [f32],
    ) {
        let l = S::LANES;
        let rp: [*const W; PANEL] = row_ptrs(ws);
        let pp = panel.as_mut_ptr();
        let mut k = k0;
        while k + l <= k1 {
            for g in 0..PANEL / l {
                let tile = s.load_tile(&rp[g * l..], k);
                for j in 0..l {
                    s.store(pp.add((k - k0 + j) * PANEL + g * l), s.tile_col(&tile, j));
                }
            }
            k += l;
        }
        while k < k1 {
            for g in 0..PANEL / l {
                s.store(pp.add((k - k0) * PANEL + g * l), column(s, &rp[g * l..], k));
            }
            k += 1;
        }
    }

    /// `MT` tokens × `NP` panels of 16 outputs (`VP` vectors each, `16 / LANES`) of the packed
    /// GEMM, continued over `kc` steps of each panel: token `t`'s accumulators of panel `q` at
    /// `acc + t·ld + 16q`. `VP` is a parameter, not
    /// [`MAX_PER_PANEL`](crate::simd::proj::kernels::MAX_PER_PANEL) vectors of which the first
    /// `16 / LANES` are used: with the longer array LLVM kept one AVX2 accumulator on the stack (a
    /// load and a store around its multiply-add in every step), and the AVX2 prefill GEMM ran at
    /// 40 % of the FMA peak instead of about 90 %. With `NP` = 2 (AVX-512, see
    /// [`Simd::PREFILL_PANELS`]) each broadcast input feeds two panels' vectors. On
    /// [`Simd::BF16_PARITY`] paths a bf16 panel is read by parity: vectors `v`, `v + 1` then hold
    /// the even and the odd outputs of the `2·LANES` from `v·LANES`, each output still one chain in
    /// order.
    #[inline(always)]
    unsafe fn panel_block<S: Simd, W: Elem, const MT: usize, const VP: usize, const NP: usize>(
        s: S,
        x: [*const f32; MT],
        kc: usize,
        panels: [*const W; NP],
        (acc, ld): (*mut f32, usize),
        ahead: Option<[*const W; NP]>,
    ) {
        let parity = W::BF16 && S::BF16_PARITY && VP.is_multiple_of(2);
        let mut a = [[[s.splat(0.0); VP]; NP]; MT];
        for (t, a) in a.iter_mut().enumerate() {
            for (q, a) in a.iter_mut().enumerate() {
                *a = block_row_load::<S, VP>(s, acc.add(t * ld + q * PANEL), parity);
            }
        }
        for p in 0..kc {
            // (A loop, not `array::from_fn`: a closure does not inherit the caller's target
            // features, so its vector operations would not be inlined.)
            let mut b = [[s.splat(0.0); VP]; NP];
            for (q, b) in b.iter_mut().enumerate() {
                *b = panel_vectors::<S, W, VP>(s, panels[q].add(p * PANEL), parity);
            }
            if let Some(ahead) = ahead {
                for a in ahead {
                    prefetch_line(a.wrapping_add(p * PANEL));
                }
            }
            for (t, a) in a.iter_mut().enumerate() {
                let xv = s.broadcast(x[t].add(p));
                for q in 0..NP {
                    for v in 0..VP {
                        a[q][v] = s.mul_add(xv, b[q][v], a[q][v]);
                    }
                }
            }
        }
        for (t, a) in a.iter().enumerate() {
            for (q, a) in a.iter().enumerate() {
                block_row_store::<S, VP>(s, acc.add(t * ld + q * PANEL), *a, parity);
            }
        }
    }

    /// One token's 16 accumulators of [`panel_block`] from `acc`, split by parity if `parity`.
    #[inline(always)]
    unsafe fn block_row_load<S: Simd, const VP: usize>(
        s: S,
        acc: *const f32,
        parity: bool,
    ) -> [S::F; VP] {
        let mut a = [s.splat(0.0); VP];
        for (v, a) in a.iter_mut().enumerate() {
            *a = s.load(acc.add(v * S::LANES));
        }
        if parity {
            for v in (0..VP).step_by(2) {
                (a[v], a[v + 1]) = s.deinterleave(a[v], a[v + 1]);
            }
        }
        a
    }

    /// Stores what [`block_row_load`] loaded, back in order.
    #[inline(always)]
    unsafe fn block_row_store<S: Simd, const VP: usize>(
        s: S,
        acc: *mut f32,
        mut a: [S::F; VP],
        parity: bool,
    ) {
        if parity {
            for v in (0..VP).step_by(2) {
                (a[v], a[v + 1]) = s.interleave(a[v], a[v + 1]);
            }
        }
        for (v, a) in a.iter().enumerate() {
            s.store(acc.add(v * S::LANES), *a);
        }
    }

    /// One step of a packed panel (16 values at `row`) as `VP` vectors: in order, or by parity
    /// (`parity` only for bf16 panels).
    #[inline(always)]
    unsafe fn panel_vectors<S: Simd, W: Elem, const VP: usize>(
        s: S,
        row: *const W,
        parity: bool,
    ) -> [S::F; VP] {
        let mut b = [s.splat(0.0); VP];
        if parity {
            debug_assert!(W::BF16);
            let row = row as *const bf16;
            for v in (0..VP).step_by(2) {
                (b[v], b[v + 1]) = s.load_bf16_parity(row.add(v * S::LANES));
            }
        } else {
            for (v, b) in b.iter_mut().enumerate() {
                *b = W::load(s, row.add(v * S::LANES));
            }
        }
        b
    }

    /// `$block!(MT)` for `MT = $n` tokens (1 to 12; the register blocks of the packed GEMMs): a
    /// const instantiation per token count.
    macro_rules! by_tokens {
        ($n:expr, $block:ident) => {
            match $n {
                12 => $block!(12),
                11 => $block!(11),
                10 => $block!(10),
                9 => $block!(9),
                8 => $block!(8),
                7 => $block!(7),
                6 => $block!(6),
                5 => $block!(5),
                4 => $block!(4),
                3 => $block!(3),
                2 => $block!(2),
                _ => $block!(1),
            }
        };
    }

    /// `$block!(VP, NP)` for a prefill register block of `NP` panels (`$np`, 1 or
    /// [`Simd::PREFILL_PANELS`]) of `VP = 16 / LANES` vectors each: the shapes the ISAs use
    /// (16 lanes: one or two panels; 8 and 4 lanes: one panel).
    macro_rules! by_panel_shape {
        ($s:ty, $np:expr, $block:ident) => {
            match (PANEL / <$s>::LANES, $np) {
                (1, 1) => $block!(1, 1),
                (1, _) => $block!(1, 2),
                (2, _) => $block!(2, 1),
                _ => $block!(4, 1),
            }
        };
    }

    /// `(start, len)` of `⌈n / most⌉` consecutive blocks covering `0..n`, at most `most` long and
    /// as even as they go: the first `n % blocks` take one more.
    #[inline(always)]
    pub(super) fn even_blocks(n: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
        let blocks = n.div_ceil(most);
        let (base, extra) = (n / blocks.max(1), n % blocks.max(1));
        (0..blocks).map(move |b| (b * base + b.min(extra), base + usize::from(b < extra)))
    }

    /// Continues `acc[t·ld + 16p + r]` over `k0..k1` from each packed panel `p` of `panels` (f32,
    /// or bf16 in the panel layout, widened as it is loaded; each starting at step `k0`): tokens
    /// in register blocks of at most [`Simd::PANEL_TOKENS`], sized as evenly as they go (256 =
    /// 14·12 + 8·11, not 21·12 + 4: a block of a few tokens has too few chains per load), each
    /// block over the panels in turn, [`Simd::prefill_panels`] at a time, while its inputs are in
    /// L1.
    #[inline(always)]
    pub(crate) unsafe fn panel_fma<S: Simd, W: Elem>(
        s: S,
        xs: &[&[f32]],
        (k0, k1): (usize, usize),
        panels: &[&[W]],
        (acc, ld): (&mut [f32], usize),
        ahead: &[&[W]],
    ) {
        let ap = acc.as_mut_ptr();
        let kc = k1 - k0;
        // The first register block prefetches `ahead[p..p + np]` with panels `p..p + np`, a line
        // per step or two, if every `ahead` slice holds the `kc` steps.
        let ahead_ok = ahead.iter().all(|h| h.len() >= kc * PANEL);
        for (b, (t0, mt)) in even_blocks(xs.len(), S::PANEL_TOKENS).enumerate() {
            let xg = &xs[t0..t0 + mt];
            let mut p = 0;
            while p < panels.len() {
                let np = s.prefill_panels().min(panels.len() - p);
                let a = ap.add(t0 * ld + p * PANEL);
                let pf = b == 0 && ahead_ok && ahead.len() >= p + np;
                macro_rules! shape {
                    ($vp:literal, $np:literal) => {{
                        macro_rules! block {
                            ($mt:literal) => {{
                                let x: [*const f32; $mt] =
                                    core::array::from_fn(|t| xg[t].as_ptr().add(k0));
                                let pp: [*const W; $np] =
                                    core::array::from_fn(|q| panels[p + q].as_ptr());
                                let h = pf.then(|| core::array::from_fn(|q| ahead[p + q].as_ptr()));
                                panel_block::<S, W, $mt, $vp, $np>(s, x, kc, pp, (a, ld), h)
                            }};
                        }
                        by_tokens!(mt, block)
                    }};
                }
                by_panel_shape!(S, np, shape);
                p += np;
            }
        }
    }

    /// `MT` tokens × `NP` panels of 16 outputs (`VP` vectors each) of the bf16-pairs GEMM over
    /// pairs `j0..j1` of panels of `n` steps (token `t`'s accumulators of panel `q` at
    /// `acc + t·ld + 16q`): every output continues its chain `acc ← dot_pairs(acc, w_j, x_j)` over
    /// `j` in order. Exact-size arrays, as [`panel_block`]'s.
    /// (Two panels sharing each broadcast pair measured 8 % slower on Zen 4 on 2026-12-03
    /// (4dcfb45) and faster on Zen 5 the same day (6046202); see [`Simd::PREFILL_PANELS`].)
    #[inline(always)]
    unsafe fn pairs_block<S: Simd, const MT: usize, const VP: usize, const NP: usize>(
        s: S,
        x: [*const u32; MT],
        (j0, j1, n): (usize, usize, usize),
        panels: [*const bf16; NP],
        (acc, ld): (*mut f32, usize),
        ahead: Option<[*const bf16; NP]>,
    ) {
        let mut a = [[[s.splat(0.0); VP]; NP]; MT];
        for (t, a) in a.iter_mut().enumerate() {
            for (q, a) in a.iter_mut().enumerate() {
                for (v, a) in a.iter_mut().enumerate() {
                    *a = s.load(acc.add(t * ld + q * PANEL + v * S::LANES));
                }
            }
        }
        let (full, tail) = pair_split((j0, j1, n));
        for j in full {
            pairs_block_step(s, &x, j, (panels, false), &mut a);
            if let Some(ahead) = ahead {
                for h in ahead {
                    prefetch_line(h.wrapping_add(2 * j * PANEL));
                }
            }
        }
        for j in tail {
            pairs_block_step(s, &x, j, (panels, true), &mut a);
        }
        for (t, a) in a.iter().enumerate() {
            for (q, a) in a.iter().enumerate() {
                for (v, a) in a.iter().enumerate() {
                    s.store(acc.add(t * ld + q * PANEL + v * S::LANES), *a);
                }
            }
        }
    }

    /// Pair `j` of each panel of [`pairs_block`] (`tail`: the half pair of an odd step count,
    /// see [`pair_rows`]) for every token.
    #[inline(always)]
    unsafe fn pairs_block_step<S: Simd, const MT: usize, const VP: usize, const NP: usize>(
        s: S,
        x: &[*const u32; MT],
        j: usize,
        (panels, tail): ([*const bf16; NP], bool),
        a: &mut [[[S::F; VP]; NP]; MT],
    ) {
        // Loops, not `array::from_fn` (see `panel_block`). The fill value is dead: every element
        // is loaded below (`S::P` has no zero of its own).
        let mut b = [[s.broadcast_pair(x[0].add(j)); VP]; NP];
        for (q, b) in b.iter_mut().enumerate() {
            let (lo, hi) = pair_rows(panels[q], j, tail);
            for (v, b) in b.iter_mut().enumerate() {
                *b = s.load_pairs(lo.add(v * S::LANES), hi.add(v * S::LANES));
            }
        }
        for (t, a) in a.iter_mut().enumerate() {
            let xv = s.broadcast_pair(x[t].add(j));
            for q in 0..NP {
                for v in 0..VP {
                    a[q][v] = s.dot_pairs(a[q][v], b[q][v], xv);
                }
            }
        }
    }

    /// Continues, for each panel `p` of `panels` (bf16, the panel layout, `n` steps from step 0),
    /// `acc[t·ld + 16p + r]` over pairs `j0..j1` for token rows of bf16 pairs `xs[t]` (from
    /// [`round_pairs_row`](crate::simd::round_pairs_row)): the bf16 precision mode's prefill GEMM,
    /// its tokens in register blocks as [`panel_fma`]'s, each block over the panels in turn,
    /// [`Simd::prefill_panels`] at a time.
    #[inline(always)]
    pub(crate) unsafe fn pairs_panel_fma<S: Simd>(
        s: S,
        xs: &[&[u32]],
        (j0, j1, n): (usize, usize, usize),
        panels: &[&[bf16]],
        (acc, ld): (&mut [f32], usize),
        ahead: &[&[bf16]],
    ) {
        let ap = acc.as_mut_ptr();
        for (b, (t0, mt)) in even_blocks(xs.len(), S::PANEL_TOKENS).enumerate() {
            let xg = &xs[t0..t0 + mt];
            let mut p = 0;
            while p < panels.len() {
                let np = s.prefill_panels().min(panels.len() - p);
                let a = ap.add(t0 * ld + p * PANEL);
                // As `panel_fma`'s: the first register block prefetches `ahead[p..p + np]` (each
                // from pair `j0`; addressed as the panels are, from pair 0).
                let pf = b == 0 && ahead.len() >= p + np;
                macro_rules! shape {
                    ($vp:literal, $np:literal) => {{
                        macro_rules! block {
                            ($mt:literal) => {{
                                let x: [*const u32; $mt] = core::array::from_fn(|t| xg[t].as_ptr());
                                let pp: [*const bf16; $np] =
                                    core::array::from_fn(|q| panels[p + q].as_ptr());
                                let h = pf.then(|| {
                                    core::array::from_fn(|q| {
                                        ahead[p + q].as_ptr().wrapping_sub(2 * j0 * PANEL)
                                    })
                                });
                                let steps = (j0, j1, n);
                                pairs_block::<S, $mt, $vp, $np>(s, x, steps, pp, (a, ld), h)
                            }};
                        }
                        by_tokens!(mt, block)
                    }};
                }
                by_panel_shape!(S, np, shape);
                p += np;
            }
        }
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn pack_panel<W: $crate::simd::vector::Elem>(ws: &[&[W]], k0: usize, k1: usize, panel: &mut [f32]) {
                $crate::simd::proj::prefill::kernels::pack_panel($token, ws, k0, k1, panel)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn panel_fma<W: $crate::simd::vector::Elem>(
                xs: &[&[f32]],
                steps: (usize, usize),
                panels: &[&[W]],
                acc: (&mut [f32], usize),
                ahead: &[&[W]],
            ) {
                $crate::simd::proj::prefill::kernels::panel_fma($token, xs, steps, panels, acc, ahead)
            }
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn pairs_panel_fma(
                xs: &[&[u32]],
                steps: (usize, usize, usize),
                panels: &[&[half::bf16]],
                acc: (&mut [f32], usize),
                ahead: &[&[half::bf16]],
            ) {
                $crate::simd::proj::prefill::kernels::pairs_panel_fma($token, xs, steps, panels, acc, ahead)
            }
        };
    }
    pub(crate) use entry_points;
}

crate::simd::instantiate!();

#[cfg(test)]
mod tests {
    use super::kernels::even_blocks;

    #[test]
    fn even_blocks_cover_in_order_and_differ_by_at_most_one() {
        for most in 1..=13 {
            for n in 0..=100 {
                let blocks: std::vec::Vec<(usize, usize)> = even_blocks(n, most).collect();
                assert_eq!(blocks.len(), n.div_ceil(most));
                let mut next = 0;
                for &(start, len) in &blocks {
                    assert_eq!(start, next, "n={n} most={most}");
                    assert!(len >= 1 && len <= most, "n={n} most={most}");
                    next += len;
                }
                assert_eq!(next, n);
                let lens = blocks.iter().map(|b| b.1);
                let (lo, hi) = (lens.clone().min(), lens.max());
                assert!(hi.zip(lo).is_none_or(|(h, l)| h - l <= 1));
            }
        }
        // The prefill's 256 tokens in 12-token blocks: 14 of 12, then 8 of 11.
        let lens: std::vec::Vec<usize> = even_blocks(256, 12).map(|b| b.1).collect();
        assert_eq!(lens, [[12; 14].as_slice(), &[11; 8]].concat());
    }
}
