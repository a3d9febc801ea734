//! Projections: `out[t, o] = Σ_i x[t, i] · W[o, i]` with `W` in checkpoint layout `[out, in]`.
//!
//! f32 and bf16 weights (every fast path) accumulate each output as one f32 chain over the
//! reduction in order, the order BLAS micro-kernels use: [`project_tile`] runs prefill as a
//! packed GEMM and decode straight from the rows, with bitwise the same result. f16 and int8
//! weights take [`dot`], eight partial sums in a fixed order.

use half::{bf16, f16};

use crate::error::{check_len, rows_of, KdaError};
use crate::quant::{BlockFormat, Blocks, GroupRows};
use crate::simd::{self, Isa, DIRECT, PANEL};
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

/// `Σ x[i]·w[i]` with bf16 `w` widened exactly to f32.
#[inline]
pub fn dot_bf16(x: &[f32], w: &[bf16]) -> f32 {
    dot_with(x, w, crate::math::bf16_to_f32)
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
        Data::I8 { data, scales } => dot_i8(x, data, scales),
        Data::Blocks(b) => dot_blocks(x, &b),
        Data::Groups(g) => dot_groups(x, &g),
    }
}

/// `Σ x[i]·w[i]` over block-quantised `w`, each block dequantised in turn (the reference the
/// fast kernels are tested against): the same eight partial sums as [`dot_f32`].
pub fn dot_blocks(x: &[f32], w: &Blocks<'_>) -> f32 {
    let e = w.format().block_elems();
    let mut buf = [0.0f32; 256];
    let mut acc = [0.0f32; LANES];
    for (k, block) in w.blocks().enumerate() {
        let base = k * e;
        if base >= x.len() {
            break;
        }
        w.format().dequantize_unchecked(block, &mut buf[..e]);
        for (i, (xv, wv)) in x[base..].iter().zip(&buf[..e]).enumerate() {
            acc[(base + i) % LANES] += xv * wv;
        }
    }
    reduce(acc)
}

/// `Σ x[i]·w[i]` over group-quantised `w` (whole rows, row-major), in the order of
/// [`dot_f32`].
pub fn dot_groups(x: &[f32], w: &GroupRows<'_>) -> f32 {
    let mut acc = [0.0f32; LANES];
    let cols = w.cols();
    for (i, xv) in x.iter().enumerate().take(w.len()) {
        acc[i % LANES] += xv * w.weight(i / cols, i % cols);
    }
    reduce(acc)
}

/// `Σ x[i] · w[i]` for an int8 run with per-row scales (normally one row: one scale).
#[inline]
pub fn dot_i8(x: &[f32], data: &[i8], scales: &[f32]) -> f32 {
    let raw = |x: &[f32], w: &[i8]| dot_with(x, w, |v| v as f32);
    match scales.len() {
        0 => 0.0,
        1 => scales[0] * raw(x, data),
        n => {
            let r = data.len() / n;
            let mut sum = 0.0f32;
            for (j, s) in scales.iter().enumerate() {
                let lo = (j * r).min(x.len());
                sum += s * raw(&x[lo..], &data[j * r..(j + 1) * r]);
            }
            sum
        }
    }
}

/// Receives outputs `o..o + vals.len()` of token `t` as `store(t, o, vals)`.
pub type Store<'s> = dyn FnMut(usize, usize, &[f32]) -> Result<(), KdaError> + 's;
/// Receives the outputs of one tile's rows for token `t` as `put(t, vals)`.
type Put<'s> = dyn FnMut(usize, &[f32]) -> Result<(), KdaError> + 's;
/// Runs on a group of token rows starting at token `t0` as `f(t0, rows)`.
type TokenGroup<'s, 'x, T = f32> = dyn FnMut(usize, &[&'x [T]]) -> Result<(), KdaError> + 's;

/// A tile's input rows: `row(t)` for `t < tokens`, each at least the matrix's columns long (or,
/// in the bf16 mode, its `cols.div_ceil(2)` bf16 pairs).
pub struct TileRows<'r, 'x, T = f32> {
    /// Input row `t`.
    pub row: &'r dyn Fn(usize) -> &'x [T],
    /// How many input rows (tokens).
    pub tokens: usize,
}

impl<T> Clone for TileRows<'_, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for TileRows<'_, '_, T> {}

/// A projection tile: output rows `o0..o1` of the matrix `w`.
#[derive(Clone, Copy)]
pub struct Tile<'m, 'w> {
    /// The matrix `[out, in]`.
    pub w: &'m MatRef<'w>,
    /// First output row.
    pub o0: usize,
    /// End of the output rows.
    pub o1: usize,
}

/// Up to 32 rows of a row-major matrix as typed slices: `mr` rows of `n` columns.
#[derive(Clone, Copy)]
struct RowBlock<'a, 'w> {
    ws: simd::Rows<'a, 'w>,
    n: usize,
    mr: usize,
}

/// Reduction steps per packed panel: 16 rows × 256 in f32 is 16 KB, half of a typical L1.
const KC: usize = 256;
/// Tokens one packed panel serves at a time (their accumulators, 16 KB, stay in cache beside
/// the panel's current k-block).
pub const PROJECT_TOKENS: usize = 256;
const TB: usize = PROJECT_TOKENS;
/// Up to this many tokens a tile runs straight from the weight rows: packing only pays when
/// several register blocks of tokens reuse the panel.
pub const PROJECT_DIRECT_MAX: usize = 4;
const DIRECT_MAX: usize = PROJECT_DIRECT_MAX;

/// Output rows per projection tile for `tokens` tokens: up to [`PROJECT_DIRECT_MAX`] tokens
/// (decode), [`simd::DECODE_LD`] rows, the [`simd::DECODE_PANELS`] 16-row panels the decode
/// kernels stream at once; more tokens (prefill), 64 rows, a whole number of the kernels'
/// 8-, 16- and 32-row groups and small enough to balance the workers.
pub fn project_tile_rows(tokens: usize) -> usize {
    if tokens <= DIRECT_MAX {
        simd::DECODE_LD
    } else {
        64
    }
}

/// f32 elements of scratch that lets [`project_tile`] run at full speed: a packed panel of
/// 16 rows × 256 reduction steps and the accumulators of 256 tokens. Less also works (down
/// to none for up to four tokens at a time), with the same result bitwise.
pub const PROJECT_SCRATCH: usize = PANEL * (KC + TB);

/// f32 elements of scratch for [`project_tile`] to pack a tile's rows whole (each weight
/// row read once, start to end, per call) for inputs of `n_in` columns and `tokens` tokens;
/// the fastest setting for prefill.
pub fn project_scratch_len(n_in: usize, tokens: usize) -> usize {
    PANEL.saturating_mul(n_in.saturating_add(tokens.min(TB)))
}

/// Computes weight rows `o0..o1` of `x · Wᵀ` for `tokens` input rows (`row(t)` gives row `t`,
/// at least `W.cols` long) and hands the values to `store(t, o, vals)`: outputs `o..o +
/// vals.len()` of token `t` (up to 64 at a time).
///
/// With more than four tokens and enough `scratch`, rows go 16 at a time: each k-block of
/// the 16 rows is packed once (bf16 widened) into a panel that every register block of
/// tokens streams through (a BLIS-style GEMM); otherwise rows go 32 at a time straight from
/// the weights, transposed in registers. Panel-layout weights skip the packing and the
/// transposes, and run up to four panels per register block of tokens. Every path computes
/// each output as one in-order chain over the reduction (see `simd::panel_fma`), so every
/// value is bitwise the same for any `o0..o1` split, any `tokens`, and any scratch size:
/// decode and prefill, and any thread count, agree exactly.
/// A row too short for the matrix (an internal bug) is an [`KdaError::Internal`] error.
pub fn project_tile(
    isa: Isa,
    x: TileRows<'_, '_>,
    tile: Tile<'_, '_>,
    scratch: &mut [f32],
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    let (TileRows { row, tokens }, Tile { w, o0, o1 }) = (x, tile);
    if let Data::Blocks(b) = w.data() {
        if b.format() == BlockFormat::Q8_0 {
            return q8_0_tile(isa, x, tile, store);
        }
    }
    if !matches!(w.data(), Data::F32(_) | Data::Bf16(_)) {
        for o in o0..o1 {
            for t in 0..tokens {
                store(t, o, &[dot(row(t), w.row(o))])?;
            }
        }
        return Ok(());
    }
    let n = w.cols();
    let pack = tokens > DIRECT_MAX && n > 0 && scratch.len() >= PANEL * (64 + 6);
    if w.is_panels() {
        return project_panels(isa, x, tile, pack, scratch, store);
    }
    let group = if pack { PANEL } else { DIRECT };
    let mut o = o0;
    while o < o1 {
        let mr = (o1 - o).min(group);
        let set = weight_rows(w, o, mr).ok_or(KdaError::Internal {
            what: "projection rows",
        })?;
        let ws = RowBlock {
            ws: set.prefix(mr),
            n,
            mr,
        };
        let mut put = |t: usize, vals: &[f32]| store(t, o, vals);
        if pack {
            // The next 16 rows (this call's or the next tile's), fetched while this tile
            // computes: the pack of a tile otherwise waits on memory.
            let next = o + mr..(o + mr + PANEL).min(w.rows());
            let fetch = |k0: usize, k1: usize| {
                for r in next.clone() {
                    match w.row(r) {
                        Data::F32(v) => simd::prefetch(&v[k0..k1]),
                        Data::Bf16(v) => simd::prefetch(&v[k0..k1]),
                        _ => {}
                    }
                }
            };
            packed(isa, x, ws, scratch, &fetch, &mut put)?;
        } else {
            direct(isa, x, ws, &mut put)?;
        }
        o += mr;
    }
    Ok(())
}

/// [`project_tile`] for a `Q8_0` matrix: each output one [`simd::dot_q8_0`] over its row's
/// blocks (dequantised in registers).
fn q8_0_tile(
    isa: Isa,
    x: TileRows<'_, '_>,
    tile: Tile<'_, '_>,
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    let (TileRows { row, tokens }, Tile { w, o0, o1 }) = (x, tile);
    let n = w.cols();
    let bad = KdaError::Internal {
        what: "Q8_0 projection rows",
    };
    for o in o0..o1 {
        let Data::Blocks(r) = w.row(o) else {
            return Err(bad);
        };
        for t in 0..tokens {
            let xr = row(t).get(..n).ok_or(bad)?;
            let v = simd::dot_q8_0(isa, xr, r.bytes()).ok_or(bad)?;
            store(t, o, &[v])?;
        }
    }
    Ok(())
}

/// [`project_tile`] for a matrix in the panel layout: decode streams up to
/// [`simd::DECODE_PANELS`] 16-row panels at once ([`simd::panels_fma`]), prefill runs the GEMM straight from each bf16 panel
/// ([`simd::panel_fma_bf16`]: no packing, no transposes). Same sums, bitwise, as the
/// row-major paths.
fn project_panels(
    isa: Isa,
    x: TileRows<'_, '_>,
    tile: Tile<'_, '_>,
    pack: bool,
    scratch: &mut [f32],
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    if pack {
        return prefill_panels(isa, x, tile, scratch, store);
    }
    let n = tile.w.cols();
    let mut kernel = |xs: &[&[f32]], panels: &[&[bf16]], acc: &mut [f32]| {
        simd::panels_fma(isa, xs, panels, 0, n, acc)
    };
    decode_panels(x, tile, &mut kernel, store)
}

/// The panel kernel of a decode tile: `kernel(xs, panels, acc)` fills
/// `acc[t·DECODE_LD + 16p + r]` for up to 4 tokens × [`simd::DECODE_PANELS`] panels.
type PanelKernel<'k, T> = dyn FnMut(&[&[T]], &[&[bf16]], &mut [f32]) -> Result<(), KdaError> + 'k;

/// Rows `o0..o1` of a panel-layout matrix for a few tokens: [`simd::DECODE_PANELS`] panels at
/// a time, token groups of up to [`DIRECT_MAX`], each group's sums from `kernel`.
fn decode_panels<T>(
    x: TileRows<'_, '_, T>,
    tile: Tile<'_, '_>,
    kernel: &mut PanelKernel<'_, T>,
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    let (TileRows { row, tokens }, Tile { w, o0, o1 }) = (x, tile);
    const MOST: usize = simd::DECODE_PANELS;
    let part = |p: usize| panel_part(p, o0, o1);
    let (p0, p1) = (o0 / PANEL, o1.div_ceil(PANEL));
    let mut acc = [0.0f32; DIRECT_MAX * simd::DECODE_LD];
    let mut pa = p0;
    while pa < p1 {
        let pb = (pa + MOST).min(p1);
        let panels: [&[bf16]; MOST] = core::array::from_fn(|i| w.panel((pa + i).min(pb - 1)));
        token_groups(row, tokens, &mut |t0, xs| {
            let acc = &mut acc[..xs.len() * simd::DECODE_LD];
            acc.fill(0.0);
            kernel(xs, &panels[..pb - pa], acc)?;
            for (i, a) in acc.chunks_exact(simd::DECODE_LD).enumerate() {
                for p in pa..pb {
                    let (lo, hi) = part(p);
                    let v = &a[(p - pa) * PANEL..(p - pa + 1) * PANEL];
                    store(t0 + i, p * PANEL + lo, &v[lo..hi])?;
                }
            }
            Ok(())
        })?;
        pa = pb;
    }
    Ok(())
}

/// [`project_tile`] in the bf16 precision mode: the input rows are bf16 pairs
/// (`simd::round_pairs_row` of the f32 rows; `row(t)` is `W.cols.div_ceil(2)` long) and the
/// matrix is bf16 in the panel layout. Each output is one chain over the pairs in order,
/// `acc ← acc + x_odd·w_odd + x_even·w_even` (`vdpbf16ps` where the CPU has it,
/// `simd::pairs_panel_fma`); prefill runs it over panels for blocks of up to 256 tokens,
/// decode streams up to eight panels at once (`simd::pairs_panels_fma`), with the same chains, so
/// every value is bitwise the same for any `o0..o1` split, any `tokens` and any scratch size.
/// Another matrix form is an [`KdaError::Internal`] error (the layer checks it first).
pub fn project_tile_pairs(
    isa: Isa,
    x: TileRows<'_, '_, u32>,
    tile: Tile<'_, '_>,
    scratch: &mut [f32],
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    let (tokens, w) = (x.tokens, tile.w);
    if !(w.is_panels() && matches!(w.data(), Data::Bf16(_))) {
        return Err(KdaError::Internal {
            what: "bf16 projections need bf16 panel-layout weights",
        });
    }
    if tokens > DIRECT_MAX && scratch.len() >= PANEL * 6 {
        return prefill_pairs(isa, x, tile, scratch, store);
    }
    let n = w.cols();
    let mut kernel = |xs: &[&[u32]], panels: &[&[bf16]], acc: &mut [f32]| {
        simd::pairs_panels_fma(isa, xs, panels, simd::PairSteps::all(n), acc)
    };
    decode_panels(x, tile, &mut kernel, store)
}

/// Rows `lo..hi` of panel `p` (rows `16p..16p + 16`) that fall in `o0..o1`, as offsets within
/// the panel.
fn panel_part(p: usize, o0: usize, o1: usize) -> (usize, usize) {
    let base = p * PANEL;
    (o0.max(base) - base, o1.min(base + PANEL) - base)
}

/// Panels of a tile the prefill kernels run at once: each register block of tokens goes over
/// all of them while its inputs are in L1, and each token's outputs of the group are stored
/// in one call.
const GROUP: usize = 4;

/// The prefill of [`project_panels`]: [`prefill_groups`] with the f32 GEMM straight from the
/// bf16 panels (`simd::panel_fma_bf16`: no packing, no transposes).
fn prefill_panels(
    isa: Isa,
    x: TileRows<'_, '_>,
    tile: Tile<'_, '_>,
    scratch: &mut [f32],
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    let n = tile.w.cols();
    let mut kernel =
        |xs: &[&[f32]], (k0, k1), panels: &[&[bf16]], acc: Acc<'_>, ahead: &[&[bf16]]| {
            let mut steps: [&[bf16]; GROUP] = [&[]; GROUP];
            for (s, p) in steps.iter_mut().zip(panels) {
                *s = p.get(k0 * PANEL..k1 * PANEL).ok_or(KdaError::Internal {
                    what: "projection panel",
                })?;
            }
            simd::panel_fma_bf16(isa, xs, (k0, k1), &steps[..panels.len()], acc, ahead)
        };
    let steps = (1, n);
    prefill_groups(x, tile, scratch, steps, &mut kernel, store)
}

/// The prefill of [`project_tile_pairs`]: [`prefill_groups`] with the bf16 pair GEMM
/// (`simd::pairs_panel_fma`), k-blocks of [`KC`] / 2 pairs.
fn prefill_pairs(
    isa: Isa,
    x: TileRows<'_, '_, u32>,
    tile: Tile<'_, '_>,
    scratch: &mut [f32],
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    let n = tile.w.cols();
    let mut kernel =
        |xs: &[&[u32]], (j0, j1), panels: &[&[bf16]], acc: Acc<'_>, ahead: &[&[bf16]]| {
            simd::pairs_panel_fma(isa, xs, simd::PairSteps { j0, j1, n }, panels, acc, ahead)
        };
    let steps = (2, n.div_ceil(2));
    prefill_groups(x, tile, scratch, steps, &mut kernel, store)
}

/// Accumulators `acc[t·ld + c]` and their token stride `ld`.
type Acc<'a> = (&'a mut [f32], usize);

/// The GEMM kernel of [`prefill_groups`]: `kernel(xs, (u0, u1), panels, (acc, ld), ahead)`
/// continues `acc[t·ld + 16p + r]` over reduction units `u0..u1` for each panel `p`, and
/// prefetches the slices `ahead` (the next group's panels over the same units; may be empty)
/// on the way.
type GroupKernel<'k, 'x, T> = dyn FnMut(&[&'x [T]], (usize, usize), &[&[bf16]], Acc<'_>, &[&[bf16]]) -> Result<(), KdaError>
    + 'k;

/// Rows `o0..o1` of a panel-layout matrix for many tokens: [`GROUP`] panels at a time, blocks
/// of up to [`TB`] tokens, k-blocks of [`KC`] steps (blocks of 128, where the group's k-block
/// and a register block's inputs fit L1 together, measured no faster on Zen 4), accumulators
/// `[token][group·16]` so that each token's outputs of the group are stored in one call; the
/// next group's panels are prefetched k-block by k-block while the first token block runs,
/// spread over its steps by the kernel.
/// The kernel counts the reduction in units of `unit` steps (`units` in all).
fn prefill_groups<'x, T>(
    x: TileRows<'_, 'x, T>,
    tile: Tile<'_, '_>,
    scratch: &mut [f32],
    (unit, units): (usize, usize),
    kernel: &mut GroupKernel<'_, 'x, T>,
    store: &mut Store<'_>,
) -> Result<(), KdaError> {
    let (TileRows { row, tokens }, Tile { w, o0, o1 }) = (x, tile);
    let group = if scratch.len() >= GROUP * PANEL * 64 {
        GROUP
    } else {
        1
    };
    let tb = tokens.min(TB).min(scratch.len() / (group * PANEL));
    let mut xs: [&[T]; TB] = [&[]; TB];
    let (p1, mut pa) = (o1.div_ceil(PANEL), o0 / PANEL);
    while pa < p1 {
        let pb = (pa + group).min(p1);
        let ld = (pb - pa) * PANEL;
        let panels: [&[bf16]; GROUP] = core::array::from_fn(|i| w.panel((pa + i).min(pb - 1)));
        // The group's outputs within `o0..o1`, as columns of the accumulators.
        let (lo, hi) = (o0.max(pa * PANEL), o1.min(pb * PANEL));
        let cols = lo - pa * PANEL..hi - pa * PANEL;
        let mut t0 = 0;
        while t0 < tokens {
            let m = (tokens - t0).min(tb);
            for (i, x) in xs.iter_mut().enumerate().take(m) {
                *x = row(t0 + i);
            }
            let acc = scratch.get_mut(..m * ld).ok_or(KdaError::Internal {
                what: "projection accumulators",
            })?;
            acc.fill(0.0);
            let mut u0 = 0;
            while u0 < units {
                let u1 = (u0 + KC / unit).min(units);
                // The next group's panels over the same units, fetched while the first
                // token block runs (spread over its steps, not all at once: on Zen 5 a
                // burst of prefetches stalled the core for 13 % of a batch-16 decode).
                let mut ahead: [&[bf16]; GROUP] = [&[]; GROUP];
                let mut count = 0;
                if t0 == 0 {
                    for (h, p) in ahead.iter_mut().zip(pa..pb) {
                        let next = w.panel(p + group);
                        let range = unit * u0 * PANEL..(unit * u1 * PANEL).min(next.len());
                        if let Some(s) = next.get(range) {
                            *h = s;
                            count += 1;
                        }
                    }
                }
                kernel(
                    &xs[..m],
                    (u0, u1),
                    &panels[..pb - pa],
                    (&mut *acc, ld),
                    &ahead[..count],
                )?;
                u0 = u1;
            }
            for (i, a) in acc.chunks_exact(ld).enumerate() {
                store(t0 + i, lo, &a[cols.clone()])?;
            }
            t0 += m;
        }
        pa = pb;
    }
    Ok(())
}

/// Up to 32 rows straight from the weight rows, up to four tokens at a time.
fn direct(
    isa: Isa,
    x: TileRows<'_, '_>,
    rows: RowBlock<'_, '_>,
    put: &mut Put<'_>,
) -> Result<(), KdaError> {
    let (TileRows { row, tokens }, RowBlock { ws, n, mr }) = (x, rows);
    let mut acc = [0.0f32; DIRECT * DIRECT_MAX];
    token_groups(row, tokens, &mut |t0, xs| {
        acc.fill(0.0);
        simd::rows_fma(isa, xs, ws, 0, n, &mut acc)?;
        for (i, a) in acc.chunks_exact(DIRECT).take(xs.len()).enumerate() {
            put(t0 + i, &a[..mr])?;
        }
        Ok(())
    })
}

/// Calls `f(t0, rows t0..t0 + m)` for consecutive groups of up to [`DIRECT_MAX`] tokens;
/// stops at the first error of `f`.
fn token_groups<'x, T>(
    row: &dyn Fn(usize) -> &'x [T],
    tokens: usize,
    f: &mut TokenGroup<'_, 'x, T>,
) -> Result<(), KdaError> {
    let mut t0 = 0;
    while t0 < tokens {
        let m = (tokens - t0).min(DIRECT_MAX);
        let xs: [&[T]; DIRECT_MAX] =
            core::array::from_fn(|i| if i < m { row(t0 + i) } else { &[] });
        f(t0, &xs[..m])?;
        t0 += m;
    }
    Ok(())
}

/// One tile of up to 16 weight rows as a packed GEMM: per k-block, one panel for up to [`TB`]
/// tokens.
fn packed(
    isa: Isa,
    x: TileRows<'_, '_>,
    rows: RowBlock<'_, '_>,
    scratch: &mut [f32],
    fetch: &dyn Fn(usize, usize),
    put: &mut Put<'_>,
) -> Result<(), KdaError> {
    let (TileRows { row, tokens }, RowBlock { ws, n, mr }) = (x, rows);
    let avail = scratch.len() / PANEL;
    // With room for the whole reduction, the tile's rows are packed once, read start to end
    // (long streams for the prefetchers), and serve every token; else one k-block at a time.
    let whole = avail >= n + 6;
    let tb = if whole {
        tokens.min(TB).min(avail - n)
    } else {
        tokens.min(TB).min(avail.saturating_sub(KC.min(n))).max(6)
    };
    let kc = if whole {
        n
    } else {
        (avail - tb).clamp(1, KC).min(n)
    };
    let (acc_all, rest) = scratch.split_at_mut(tb * PANEL);
    let panel = &mut rest[..kc * PANEL];
    if whole {
        simd::pack_panel(isa, ws, 0, n, panel)?;
    }
    let step = if whole { KC } else { kc };
    let mut xs: [&[f32]; TB] = [&[]; TB];
    let mut t0 = 0;
    while t0 < tokens {
        let m = (tokens - t0).min(tb);
        for (i, x) in xs.iter_mut().enumerate().take(m) {
            *x = row(t0 + i);
        }
        let acc = &mut acc_all[..m * PANEL];
        acc.fill(0.0);
        let mut k0 = 0;
        while k0 < n {
            let k1 = (k0 + step).min(n);
            if t0 == 0 {
                fetch(k0, k1);
            }
            if whole {
                simd::panel_fma(isa, &xs[..m], k0, k1, &panel[k0 * PANEL..k1 * PANEL], acc)?;
            } else {
                simd::pack_panel(isa, ws, k0, k1, panel)?;
                simd::panel_fma(isa, &xs[..m], k0, k1, panel, acc)?;
            }
            k0 = k1;
        }
        for (i, a) in acc.chunks_exact(PANEL).enumerate() {
            put(t0 + i, &a[..mr])?;
        }
        t0 += m;
    }
    Ok(())
}

/// Up to 32 weight rows as typed slices.
enum RowSet<'w> {
    F32([&'w [f32]; DIRECT]),
    Bf16([&'w [bf16]; DIRECT]),
}

impl<'w> RowSet<'w> {
    fn prefix(&self, mr: usize) -> simd::Rows<'_, 'w> {
        match self {
            RowSet::F32(r) => simd::Rows::F32(&r[..mr]),
            RowSet::Bf16(r) => simd::Rows::Bf16(&r[..mr]),
        }
    }
}

/// Rows `o..o+mr` of `w` (`1 ≤ mr ≤ 32`).
fn weight_rows<'w>(w: &MatRef<'w>, o: usize, mr: usize) -> Option<RowSet<'w>> {
    let pick = |j: usize| o + j.min(mr.max(1) - 1);
    match w.data() {
        Data::F32(_) => {
            let mut r: [&[f32]; DIRECT] = [&[]; DIRECT];
            for (j, slot) in r.iter_mut().enumerate() {
                let Data::F32(s) = w.row(pick(j)) else {
                    return None;
                };
                *slot = s;
            }
            Some(RowSet::F32(r))
        }
        Data::Bf16(_) => {
            let mut r: [&[bf16]; DIRECT] = [&[]; DIRECT];
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

/// `out = x · Wᵀ` for `rows` input rows: `x` is `[rows, W.cols]`, `out` is `[rows, W.rows]`.
pub fn linear(x: &[f32], w: &MatRef<'_>, out: &mut [f32]) -> Result<(), KdaError> {
    linear_with(Isa::detect(), x, w, out)
}

/// [`linear`] on a chosen kernel path.
pub fn linear_with(isa: Isa, x: &[f32], w: &MatRef<'_>, out: &mut [f32]) -> Result<(), KdaError> {
    let (n_out, n_in) = (w.rows(), w.cols());
    if n_in == 0 {
        // A zero-width input gives all-zero outputs; only `out` must be a whole number of rows.
        if n_out != 0 {
            rows_of("linear out", out.len(), n_out)?;
        }
        out.fill(0.0);
        return Ok(());
    }
    let rows = rows_of("linear x", x.len(), n_in)?;
    check_len("linear out", out.len(), rows * n_out)?;
    let row = |t: usize| &x[t * n_in..(t + 1) * n_in];
    let mut scratch = [0.0f32; PANEL * 64];
    let mut store = |t: usize, o: usize, v: &[f32]| {
        out[t * n_out + o..t * n_out + o + v.len()].copy_from_slice(v);
        Ok(())
    };
    let x = TileRows {
        row: &row,
        tokens: rows,
    };
    let tile = Tile {
        w,
        o0: 0,
        o1: n_out,
    };
    project_tile(isa, x, tile, &mut scratch, &mut store)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_rng::uniform as lcg;

    /// Random `[n_out, n_in]` bf16 weights, row-major and packed in the panel layout.
    fn bf16_rows_and_panels(
        s: &mut u64,
        n_out: usize,
        n_in: usize,
    ) -> (std::vec::Vec<bf16>, std::vec::Vec<bf16>) {
        let wb: std::vec::Vec<bf16> = (0..n_out * n_in).map(|_| bf16::from_f32(lcg(s))).collect();
        let rows = MatRef::new("w", Data::Bf16(&wb), n_out, n_in).unwrap();
        let mut pk = std::vec![bf16::ZERO; crate::weights::panels_len(n_out, n_in).unwrap()];
        crate::weights::pack_panels(&rows, &mut pk).unwrap();
        (wb, pk)
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
    fn panel_layout_gives_the_row_major_bits_for_any_tile_and_scratch() {
        let mut s = 11u64;
        let (n_in, n_out) = (70, 37);
        let x: std::vec::Vec<f32> = (0..13 * n_in).map(|_| lcg(&mut s)).collect();
        let (wb, pk) = bf16_rows_and_panels(&mut s, n_out, n_in);
        let rows = MatRef::new("w", Data::Bf16(&wb), n_out, n_in).unwrap();
        let panels = MatRef::new_panels("w", Data::Bf16(&pk), n_out, n_in).unwrap();
        assert!(crate::weights::pack_panels(&panels, &mut pk.clone()).is_err());
        for isa in Isa::all_supported() {
            for tokens in [1usize, 2, 4, 5, 13] {
                for (o0, o1) in [(0, n_out), (0, 16), (5, 21), (16, 37), (32, 37)] {
                    for scratch_len in [0usize, PANEL * 70, project_scratch_len(n_in, tokens)] {
                        let row = |t: usize| &x[t * n_in..(t + 1) * n_in];
                        let run = |m: &MatRef<'_>| {
                            let mut out = std::vec![f32::NAN; tokens * n_out];
                            let mut scratch = std::vec![0.0f32; scratch_len];
                            let mut store = |t: usize, o: usize, v: &[f32]| {
                                out[t * n_out + o..t * n_out + o + v.len()].copy_from_slice(v);
                                Ok(())
                            };
                            let x = TileRows { row: &row, tokens };
                            let tile = Tile { w: m, o0, o1 };
                            project_tile(isa, x, tile, &mut scratch, &mut store).unwrap();
                            out
                        };
                        let (a, b) = (run(&rows), run(&panels));
                        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                            let o = i % n_out;
                            if (o0..o1).contains(&o) {
                                assert_eq!(
                                    a.to_bits(),
                                    b.to_bits(),
                                    "{isa:?} t={tokens} {o0}..{o1} s={scratch_len} i={i}"
                                );
                            } else {
                                assert!(a.is_nan() && b.is_nan(), "wrote outside the tile");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The bf16 mode's projection: every ISA path, tile, token count and scratch size gives
    /// the bits of the reference loops (one token at a time), and only the tile is written;
    /// row-major weights are refused.
    #[test]
    fn pair_projection_gives_the_same_bits_for_any_path_tile_and_scratch() {
        let mut s = 13u64;
        for (n_in, n_out) in [(70usize, 37usize), (37, 64), (129, 70)] {
            let x: std::vec::Vec<f32> = (0..300 * n_in).map(|_| lcg(&mut s)).collect();
            let pairs: std::vec::Vec<u32> = x
                .chunks_exact(n_in)
                .flat_map(|r| {
                    let mut p = std::vec![0u32; n_in.div_ceil(2)];
                    simd::round_pairs_row(Isa::Portable, r, &mut p).unwrap();
                    p
                })
                .collect();
            let (wb, pk) = bf16_rows_and_panels(&mut s, n_out, n_in);
            let rows = MatRef::new("w", Data::Bf16(&wb), n_out, n_in).unwrap();
            let panels = MatRef::new_panels("w", Data::Bf16(&pk), n_out, n_in).unwrap();
            let w2 = n_in.div_ceil(2);
            let row = |t: usize| &pairs[t * w2..(t + 1) * w2];
            let run = |isa: Isa, tokens: usize, (o0, o1): (usize, usize), scratch_len: usize| {
                let mut out = std::vec![f32::NAN; tokens * n_out];
                let mut scratch = std::vec![0.0f32; scratch_len];
                let mut store = |t: usize, o: usize, v: &[f32]| {
                    out[t * n_out + o..t * n_out + o + v.len()].copy_from_slice(v);
                    Ok(())
                };
                let x = TileRows { row: &row, tokens };
                let tile = Tile { w: &panels, o0, o1 };
                project_tile_pairs(isa, x, tile, &mut scratch, &mut store).map(|_| out)
            };
            let want = run(Isa::Portable, 300, (0, n_out), 0).unwrap();
            for isa in Isa::all_supported() {
                for tokens in [1usize, 4, 5, 13, 300] {
                    for (o0, o1) in [(0, n_out), (0, 16), (5, 21), (16, 37), (32, 37)] {
                        for scratch_len in [0usize, PANEL * 6, PANEL * 300, PANEL * 4 * 300] {
                            let got = run(isa, tokens, (o0, o1), scratch_len).unwrap();
                            for (i, g) in got.iter().enumerate() {
                                let o = i % n_out;
                                if (o0..o1).contains(&o) {
                                    assert_eq!(
                                        g.to_bits(),
                                        want[i].to_bits(),
                                        "{isa:?} {n_in}x{n_out} t={tokens} {o0}..{o1} s={scratch_len}"
                                    );
                                } else {
                                    assert!(g.is_nan(), "wrote outside the tile");
                                }
                            }
                        }
                    }
                }
            }
            let mut store = |_: usize, _: usize, _: &[f32]| Ok(());
            let x = TileRows {
                row: &row,
                tokens: 1,
            };
            let tile = Tile {
                w: &rows,
                o0: 0,
                o1: 1,
            };
            let err = project_tile_pairs(Isa::Portable, x, tile, &mut [], &mut store);
            assert!(matches!(err, Err(KdaError::Internal { .. })));
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
