//! The chunked (WY/UT) form of the delta rule for one head of one sequence (spec §5–6).
//!
//! Per chunk of `L ≤ C` tokens, with `b_r` the chunk-local cumulative log-decay and
//! `Δ = (I + A_kk)⁻¹ · diag(β)(V − (K⊙e^{b}) S₀)` the innovations:
//!
//! ```text
//! O      = scale·(Q⊙e^{b}) S₀ + A_qk Δ
//! S_next = diag(e^{b_{L−1}}) S₀ + (K⊙e^{b_{L−1}−b})ᵀ Δ
//! ```
//! with `A_kk[i,j] = β_i Σ_d k_id k_jd e^{b_id−b_jd}` (`j < i`) and
//! `A_qk[i,j] = scale Σ_d q_id k_jd e^{b_id−b_jd}` (`j ≤ i`). Δ comes from a blockwise forward
//! substitution directly on the right-hand side (no explicit inverse and no `W`/`U` matrices:
//! one `[L×K]·[K×V]` product instead of two).
//!
//! **Exponents.** In a *tame* chunk, one whose every `|b_r − b_0|` is ≤ 80 (the usual case),
//! every factor `e^{b_i − b_j}` is the product of two normal f32s `e^{b_i − b_0}·e^{b_0 − b_j}`:
//! one exponent row per row (and its reciprocal) and `e^{b_0}` give them all, and
//! `A = (Q⊙e^{b−b_0})(K⊙e^{b_0−b})ᵀ` over the whole chunk. Otherwise every exponent is a
//! difference of cumulative sums that is ≤ 0, except on the 16-row diagonal blocks of `A`,
//! which use the block's first row as reference (factors up to `e^{spread}`); that is done only
//! when the block's decay spread is ≤ 80 (so every factor is a normal f32), and the block falls
//! back to per-pair exponents otherwise. So any gate ≤ 0 works — hard resets (−1000) and the
//! unbounded softplus gate included — where fla's fast path returns inf/NaN. Cumulative sums
//! are kept as an f32 pair (value + rounding error), so a difference of two sums near −1000 is
//! still exact to f32 precision.
//!
//! **Layouts.** [`chunked_head`] runs over contiguous `[T, K]` rows in place;
//! [`chunked_head_strided`] reads each input as [`StridedRows`] (e.g. one head of `[T, H, K]`
//! tensors, with no copy) and hands the outputs over chunk by chunk.
//!
//! Gates must be ≤ 0 (both gate forms guarantee it); NaN propagates.

mod strided;

pub use strided::{RowsHint, StridedHead, StridedInputs, StridedRows};

use super::{HeadDims, HeadRows};
use crate::error::{check_len, KdaError};
use crate::simd::{self, CStart, Isa, RowQueue};

/// Rows of the diagonal blocks of `A`.
const SUB: usize = 16;
/// Largest decay spread (in nats) across one diagonal block for the factorised form.
const MAX_SPREAD: f32 = 80.0;

/// How a sequence's rows split into chunks: chunks of `size` (1..=[`MAX_CHUNK`]) tokens, the
/// first `first` long (`1..=size`: a sequence that arrives in pieces keeps its chunk grid),
/// the last partial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunks {
    /// Chunk size `C`.
    pub size: usize,
    /// Length of the first chunk.
    pub first: usize,
}

impl Chunks {
    /// Chunks of `size` from the first row.
    pub fn of(size: usize) -> Self {
        Chunks { size, first: size }
    }
}

/// Largest supported chunk size.
pub const MAX_CHUNK: usize = 256;

/// The scratch slices of one chunk of `l ≤ C` rows, carved from the caller's buffer. `b` is the
/// chunk-local cumulative log-decay (`b_r = Σ_{s ≤ r} g_s`, per key dimension).
struct Scratch<'a> {
    /// `[C, K]` high part of `b` (the running f32 sum).
    cum_hi: &'a mut [f32],
    /// `[C, K]` low part of `b` (the rounding error of `cum_hi`, TwoSum-compensated).
    cum_lo: &'a mut [f32],
    /// `[2C, K]` rows `0..l`: `q ⊙ e^{b − b_0}`, rows `l..2l`: `k ⊙ e^{b − b_0}` (a tame
    /// chunk's, see [`tame_factors`]; stacked so that one product gives both `A`s).
    qkf: &'a mut [f32],
    /// `[2C, K]` rows `0..l`: `scale · q ⊙ e^{b}`, rows `l..2l`: `k ⊙ e^{b}` (queries and keys
    /// decayed to the chunk start, stacked so that one product with the state serves both).
    decayed: &'a mut [f32],
    /// `[C, K]` `k ⊙ e^{b_{l−1} − b}`: keys decayed to the chunk end; also the scratch rows of
    /// `k̂` (keys relative to a diagonal block's first row) while `A` is built. In a tame
    /// chunk, `k ⊙ e^{b_0 − b}`.
    k_to_end: &'a mut [f32],
    /// `[K, C]` `k_to_end` transposed (the state update's left factor).
    k_to_end_t: &'a mut [f32],
    /// `[16, K]` one diagonal block's `q ⊙ e^{b − b_{a0}}`.
    q_block: &'a mut [f32],
    /// `[16, K]` one diagonal block's `k ⊙ e^{b − b_{a0}}`.
    k_block: &'a mut [f32],
    /// `[K, C]` `k̂` transposed (in a tame chunk, `k ⊙ e^{b_0 − b}` transposed).
    k_hat_t: &'a mut [f32],
    /// `[2C, C]` rows `0..l`: `A_qk` (scaled, lower triangular with diagonal); rows `l..2l`:
    /// `−A_kk` (β-scaled rows, strictly lower triangular). Both `[l, l]` (see [`split_a`]).
    a: &'a mut [f32],
    /// `[2C, V]` rows `0..l`: the chunk's outputs; rows `l..2l`: the right-hand side, then the
    /// innovations `Δ` in place (the two products with the state, stacked like `decayed`).
    out_delta: &'a mut [f32],
    /// `[K]` `e^{b_{l−1}}`: the whole chunk's decay per key row.
    chunk_decay: &'a mut [f32],
    /// `[K]` `e^{b_0}`: the first row's decay (a tame chunk's).
    first_decay: &'a mut [f32],
    /// `[K]` the last row's `e^{b − b_0}` (a tame chunk's).
    last_exps: &'a mut [f32],
}

/// f32 elements of scratch [`chunked_head`] needs for chunk size `chunk`, key dim `k`, value
/// dim `v` (0 for an invalid chunk size).
pub fn chunked_scratch_len(chunk: usize, k: usize, v: usize) -> usize {
    if chunk == 0 || chunk > MAX_CHUNK {
        return 0;
    }
    let c = chunk;
    // Nine [C, K] (cum_hi … k_hat_t, qkf and decayed counting two), two [16, K] (q_block,
    // k_block), two [C, C] (a), two [C, V] (out_delta), three [K] (chunk_decay,
    // first_decay, last_exps).
    // Saturating: an impossible size makes the caller's workspace check fail, not overflow.
    (9 * c)
        .saturating_mul(k)
        .saturating_add((2 * SUB).saturating_mul(k))
        .saturating_add(2 * c * c)
        .saturating_add((2 * c).saturating_mul(v))
        .saturating_add(k.saturating_mul(3))
}

fn carve(buf: &mut [f32], c: usize, k: usize, v: usize) -> Scratch<'_> {
    let (cum_hi, rest) = buf.split_at_mut(c * k);
    let (cum_lo, rest) = rest.split_at_mut(c * k);
    let (qkf, rest) = rest.split_at_mut(2 * c * k);
    let (decayed, rest) = rest.split_at_mut(2 * c * k);
    let (k_to_end, rest) = rest.split_at_mut(c * k);
    let (k_to_end_t, rest) = rest.split_at_mut(c * k);
    let (k_hat_t, rest) = rest.split_at_mut(c * k);
    let (q_block, rest) = rest.split_at_mut(SUB * k);
    let (k_block, rest) = rest.split_at_mut(SUB * k);
    let (a, rest) = rest.split_at_mut(2 * c * c);
    let (out_delta, rest) = rest.split_at_mut(2 * c * v);
    let (chunk_decay, rest) = rest.split_at_mut(k);
    let (first_decay, rest) = rest.split_at_mut(k);
    let last_exps = &mut rest[..k];
    Scratch {
        cum_hi,
        cum_lo,
        qkf,
        decayed,
        k_to_end,
        k_to_end_t,
        q_block,
        k_block,
        k_hat_t,
        a,
        out_delta,
        chunk_decay,
        first_decay,
        last_exps,
    }
}

/// A chunk size outside `1..=MAX_CHUNK` is a configuration error.
fn check_chunk_size(chunk: usize) -> Result<(), KdaError> {
    if chunk == 0 || chunk > MAX_CHUNK {
        return Err(KdaError::Config {
            field: "chunk_size",
            reason: "must be between 1 and 256",
        });
    }
    Ok(())
}

/// The caller's scratch, checked and carved for chunks of `chunk` rows.
fn scratch_for(
    scratch: &mut [f32],
    chunk: usize,
    kd: usize,
    vd: usize,
) -> Result<Scratch<'_>, KdaError> {
    let need = chunked_scratch_len(chunk, kd, vd);
    if scratch.len() < need {
        return Err(KdaError::TooSmall {
            arg: "chunk scratch",
            needed: need,
            actual: scratch.len(),
        });
    }
    Ok(carve(scratch, chunk, kd, vd))
}

/// The chunks `(first row, rows)` of `t_len` rows on the grid `chunks` (size checked).
fn chunk_grid(t_len: usize, chunks: Chunks) -> impl Iterator<Item = (usize, usize)> {
    let (mut c0, mut len) = (0, chunks.first.clamp(1, chunks.size));
    core::iter::from_fn(move || {
        if c0 >= t_len {
            return None;
        }
        let l = len.min(t_len - c0);
        let chunk = (c0, l);
        c0 += l;
        len = chunks.size;
        Some(chunk)
    })
}

/// Runs the chunked delta rule over the `T` rows of one head of one sequence (`rows`), in
/// place: outputs replace the values, the final state the initial one. `chunks` sets the chunk
/// grid; `scratch`: at least [`chunked_scratch_len`]`(C, K, V)` elements.
pub fn chunked_head(
    isa: Isa,
    rows: HeadRows<'_>,
    chunks: Chunks,
    scratch: &mut [f32],
) -> Result<(), KdaError> {
    check_chunk_size(chunks.size)?;
    let HeadDims {
        t: t_len,
        k: kd,
        v: vd,
    } = rows.dims()?;
    if t_len == 0 {
        return Ok(());
    }
    let HeadRows {
        q,
        k,
        g,
        beta,
        v_o,
        state,
        scale,
    } = rows;
    let mut sc = scratch_for(scratch, chunks.size, kd, vd)?;
    let head = HeadIn {
        q: StridedRows::contiguous(q, kd),
        k: StridedRows::contiguous(k, kd),
        g: StridedRows::contiguous(g, kd),
        beta: StridedRows::contiguous(beta, 1),
        scale,
        kd,
        vd,
    };
    let mut grid = chunk_grid(t_len, chunks).peekable();
    while let Some((c0, l)) = grid.next() {
        let vals = |c0: usize, l: usize| c0 * vd..(c0 + l) * vd;
        if let Some(&(n0, nl)) = grid.peek() {
            let v = StridedRows::contiguous(&v_o[vals(n0, nl)], vd);
            head.chunk(n0, nl, v).prefetch();
        }
        let v = StridedRows::contiguous(&v_o[vals(c0, l)], vd);
        one_chunk(isa, &head.chunk(c0, l, v), state, &mut sc, None)?;
        v_o[vals(c0, l)].copy_from_slice(&sc.out_delta[..l * vd]);
    }
    Ok(())
}

/// [`chunked_head`] over rows read in place out of larger tensors (no copy of the inputs),
/// the outputs handed to `out` chunk by chunk, in token order: `out(t0, o)` with `o` the
/// `[l, V]` outputs of tokens `t0..t0 + l`. The final state replaces the initial one.
/// `scratch`: at least [`chunked_scratch_len`]`(C, K, V)` elements.
pub fn chunked_head_strided(
    isa: Isa,
    head: StridedHead<'_>,
    chunks: Chunks,
    scratch: &mut [f32],
    mut out: impl FnMut(usize, &[f32]),
) -> Result<(), KdaError> {
    check_chunk_size(chunks.size)?;
    let StridedHead {
        inputs,
        state,
        scale,
        next,
        out_rows,
    } = head;
    let StridedInputs {
        tokens,
        q,
        k,
        g,
        beta,
        v,
    } = inputs;
    let (kd, vd) = (q.dim, v.dim);
    q.check("q", tokens, kd)?;
    k.check("k", tokens, kd)?;
    g.check("g", tokens, kd)?;
    beta.check("beta", tokens, 1)?;
    v.check("v", tokens, vd)?;
    check_len("state", state.len(), crate::error::mul("state", kd, vd)?)?;
    if tokens == 0 {
        return Ok(());
    }
    let mut sc = scratch_for(scratch, chunks.size, kd, vd)?;
    let head = HeadIn {
        q,
        k,
        g,
        beta,
        scale,
        kd,
        vd,
    };
    let mut grid = chunk_grid(tokens, chunks).peekable();
    while let Some((c0, l)) = grid.next() {
        // What runs next, fetched a row at a time by the chunk's products.
        let after = match grid.peek() {
            Some(&(n0, nl)) => Some(head.chunk(n0, nl, v.skip_rows(n0)).rows()),
            None => next,
        };
        // This chunk's destination rows first (written when it ends), then what runs next.
        let mut queue = RowQueue::new();
        if let Some(o) = out_rows {
            queue.push_hint(o.row_start(c0), (l, o.dim, o.stride));
        }
        if let Some(rows) = after {
            rows.enqueue(&mut queue);
        }
        let inp = head.chunk(c0, l, v.skip_rows(c0));
        one_chunk(isa, &inp, state, &mut sc, Some(&queue))?;
        queue.drain();
        out(c0, &sc.out_delta[..l * vd]);
    }
    Ok(())
}

/// The 16-row diagonal blocks `(a0, a1)` of a chunk of `l` rows.
#[inline(always)]
fn sub_blocks(l: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..l).step_by(SUB).map(move |a0| (a0, (a0 + SUB).min(l)))
}

/// `(b_i − b_j)[d]` from the compensated cumulative sums.
#[inline(always)]
fn diff(bh: &[f32], bl: &[f32], i: usize, j: usize, d: usize, kd: usize) -> f32 {
    (bh[i * kd + d] - bh[j * kd + d]) + (bl[i * kd + d] - bl[j * kd + d])
}

/// `out = b_i − b_j` for a whole row (vectorisable).
#[inline(always)]
fn diff_row(out: &mut [f32], bh: &[f32], bl: &[f32], i: usize, j: usize, kd: usize) {
    let (hi, hj) = (&bh[i * kd..(i + 1) * kd], &bh[j * kd..(j + 1) * kd]);
    let (li, lj) = (&bl[i * kd..(i + 1) * kd], &bl[j * kd..(j + 1) * kd]);
    for ((((o, a), b), c), d) in out.iter_mut().zip(hi).zip(hj).zip(li).zip(lj) {
        *o = (a - b) + (c - d);
    }
}

/// `max_d (b_i − b_j)[d]`, NaN if any difference is NaN (so a NaN never passes a `≤` test).
#[inline(always)]
fn max_diff(bh: &[f32], bl: &[f32], i: usize, j: usize, kd: usize) -> f32 {
    (0..kd).fold(0.0f32, |m, d| {
        let s = diff(bh, bl, i, j, d, kd);
        if s > m || s.is_nan() {
            s
        } else {
            m
        }
    })
}

/// `out[d] = a[d] · b[d]`.
#[inline(always)]
fn mul_rows(out: &mut [f32], a: &[f32], b: &[f32]) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
}

/// The read-only inputs of one head but its values: `q`, `k`, `g` rows of `K`, `beta` of 1.
#[derive(Clone, Copy)]
struct HeadIn<'a> {
    q: StridedRows<'a>,
    k: StridedRows<'a>,
    g: StridedRows<'a>,
    beta: StridedRows<'a>,
    scale: f32,
    kd: usize,
    vd: usize,
}

impl<'a> HeadIn<'a> {
    /// The chunk of rows `c0..c0 + l`, with its values `v` (rows from `c0`).
    #[inline(always)]
    fn chunk(&self, c0: usize, l: usize, v: StridedRows<'a>) -> ChunkIn<'a> {
        ChunkIn {
            q: self.q.skip_rows(c0),
            k: self.k.skip_rows(c0),
            g: self.g.skip_rows(c0),
            beta: self.beta.skip_rows(c0),
            v,
            l,
            scale: self.scale,
            kd: self.kd,
            vd: self.vd,
        }
    }
}

/// The read-only inputs of one chunk of `l` rows: `q`, `k`, `g` rows of `K`, `beta` of 1,
/// `v` of `V`, each from the chunk's first row.
#[derive(Clone, Copy)]
struct ChunkIn<'a> {
    q: StridedRows<'a>,
    k: StridedRows<'a>,
    g: StridedRows<'a>,
    beta: StridedRows<'a>,
    v: StridedRows<'a>,
    l: usize,
    scale: f32,
    kd: usize,
    vd: usize,
}

impl<'a> ChunkIn<'a> {
    /// The chunk's input rows, to queue for prefetching.
    #[inline(always)]
    fn rows(&self) -> StridedInputs<'a> {
        StridedInputs {
            tokens: self.l,
            q: self.q,
            k: self.k,
            g: self.g,
            beta: self.beta,
            v: self.v,
        }
    }

    /// Hints the caches to fetch the chunk's input rows in one burst ([`chunked_head`]'s next
    /// chunk, contiguous rows; strided rows go through a `RowQueue` instead).
    #[inline(always)]
    fn prefetch(&self) {
        for x in self.rows().sets() {
            x.prefetch(self.l);
        }
    }
}

/// Runs one chunk on the requested path; its outputs are left in `sc.out_delta[..l·V]`. The
/// AVX2 variant is the same code compiled with AVX2 and FMA enabled, so its plain loops
/// vectorise 8 wide.
fn one_chunk(
    isa: Isa,
    inp: &ChunkIn<'_>,
    state: &mut [f32],
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx512F | Isa::Avx512Bf16) && isa.is_supported() {
        // SAFETY: the CPU supports AVX-512F, AVX2 and FMA (checked just above); the function
        // has no other requirement (it is safe Rust compiled with those features enabled).
        return unsafe { one_chunk_avx512(isa, inp, state, sc, queue) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2Fma && isa.is_supported() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above); the function has no
        // other requirement (it is safe Rust compiled with those features enabled).
        return unsafe { one_chunk_avx2(isa, inp, state, sc, queue) };
    }
    one_chunk_body(isa, inp, state, sc, queue)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn one_chunk_avx2(
    isa: Isa,
    inp: &ChunkIn<'_>,
    state: &mut [f32],
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    one_chunk_body(isa, inp, state, sc, queue)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn one_chunk_avx512(
    isa: Isa,
    inp: &ChunkIn<'_>,
    state: &mut [f32],
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    one_chunk_body(isa, inp, state, sc, queue)
}

/// One chunk of `l` rows: the steps of the module docs, each its own function (inlined, so
/// the AVX2 instantiation compiles all of them with AVX2 enabled).
#[inline(always)]
fn one_chunk_body(
    isa: Isa,
    inp: &ChunkIn<'_>,
    state: &mut [f32],
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    if tame_factors(isa, inp, sc)? {
        tame_matrices(isa, inp, sc, queue)?;
    } else {
        cumulative_decay(inp, sc);
        row_factors(isa, inp, sc)?;
        intra_chunk_matrices(isa, inp, sc)?;
    }
    state_products(isa, inp, state, sc, queue)?;
    innovations(isa, inp, sc)?;
    chunk_outputs(isa, inp, sc, queue)?;
    update_state(isa, inp, state, sc, queue)
}

/// Step 1 of a chunk that is not tame: compensated chunk-local cumulative sums `b` of the
/// log-decay (TwoSum per step; a tame chunk's [`tame_factors`] keeps them per row instead).
#[inline(always)]
fn cumulative_decay(inp: &ChunkIn<'_>, sc: &mut Scratch<'_>) {
    let (kd, l) = (inp.kd, inp.l);
    let (hi, lo) = (&mut sc.cum_hi[..l * kd], &mut sc.cum_lo[..l * kd]);
    hi[..kd].copy_from_slice(inp.g.row(0));
    lo[..kd].fill(0.0);
    for r in 1..l {
        let (prev, cur) = hi.split_at_mut(r * kd);
        let (lprev, lcur) = lo.split_at_mut(r * kd);
        let (ph, pl) = (&prev[(r - 1) * kd..], &lprev[(r - 1) * kd..]);
        for ((((c, lc), &a), &pl), &x) in cur[..kd]
            .iter_mut()
            .zip(&mut lcur[..kd])
            .zip(ph)
            .zip(pl)
            .zip(inp.g.row(r))
        {
            let s = a + x;
            let bp = s - a;
            let err = (a - (s - bp)) + (x - bp);
            *c = s;
            *lc = pl + err;
        }
    }
}

/// Step 2 of a tame chunk, one whose every `|b_r − b_0|` is ≤ [`MAX_SPREAD`] (its decay spread,
/// with gates ≤ 0); returns whether the chunk is tame (if not, nothing it wrote is used). In a
/// tame chunk every factor `e^{b_i − b_j}` is the product `e^{b_i − b_0} · e^{b_0 − b_j}` of two
/// normal f32s, so one exponent row and its reciprocal per row, and `e^{b_0}`, give them all,
/// in one pass over the inputs ([`simd::tame_rows`], with the running sums `b`). Per row:
/// `qf = q ⊙ e^{b − b_0}`, `kf = k ⊙ e^{b − b_0}`,
/// `kb = k ⊙ e^{b_0 − b}` (in `k_to_end`); the decayed queries and keys are
/// `e^{b_0} ⊙ qf` (scaled) and `e^{b_0} ⊙ kf`; the keys to the chunk end `e^{b_{l−1} − b_0} ⊙ kb`
/// (kept transposed); and [`tame_matrices`] builds `A` as `qf·kbᵀ`, `kf·kbᵀ`.
#[inline(always)]
fn tame_factors(isa: Isa, inp: &ChunkIn<'_>, sc: &mut Scratch<'_>) -> Result<bool, KdaError> {
    let (kd, l) = (inp.kd, inp.l);
    fn rows<'a>(x: &StridedRows<'a>) -> (&'a [f32], usize) {
        (x.data, x.stride)
    }
    let (qd, kd_) = sc.decayed[..2 * l * kd].split_at_mut(l * kd);
    let (qf, kf) = sc.qkf[..2 * l * kd].split_at_mut(l * kd);
    let tame = simd::tame_rows(
        isa,
        &simd::TameIn {
            q: rows(&inp.q),
            k: rows(&inp.k),
            g: rows(&inp.g),
            rows: l,
            dim: kd,
            scale: inp.scale,
            limit: MAX_SPREAD,
        },
        &mut simd::TameOut {
            qf,
            kf,
            kb: &mut sc.k_to_end[..l * kd],
            qd,
            kd: kd_,
            first: sc.first_decay,
            last: sc.last_exps,
            hi: &mut sc.cum_hi[..kd],
            lo: &mut sc.cum_lo[..kd],
        },
    )?;
    if !tame {
        return Ok(false);
    }
    // `last_exps` holds e^{b_{l−1} − b_0}: `kbᵀ` and the keys to the chunk end in one pass.
    let (fwd, e0) = (&*sc.last_exps, &*sc.first_decay);
    let kb = (&sc.k_to_end[..l * kd], kd);
    let to_end = (&mut sc.k_to_end_t[..kd * l], &fwd[..kd]);
    simd::transpose_scaled(isa, (l, kd), kb, (&mut sc.k_hat_t[..kd * l], l), to_end)?;
    mul_rows(sc.chunk_decay, e0, fwd);
    Ok(true)
}

/// Step 3 of a tame chunk: `A_qk = scale·qf·kbᵀ` and `A_kk = kf·kbᵀ` over the whole chunk at
/// once (no diagonal blocks) in one product of the stacked factors, then scaled and cut like
/// [`intra_chunk_matrices`].
#[inline(always)]
fn tame_matrices(
    isa: Isa,
    inp: &ChunkIn<'_>,
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    let (kd, l) = (inp.kd, inp.l);
    let kbt = (&sc.k_hat_t[..kd * l], l);
    let qkf = (&sc.qkf[..2 * l * kd], kd);
    let a = (&mut sc.a[..2 * l * l], l);
    simd::gemm_queued(isa, CStart::Zero, (2 * l, l, kd), qkf, kbt, a, queue)?;
    scale_and_mask(inp, sc, 0, l);
    Ok(())
}

/// Step 2 of a chunk that is not tame: row factors against the chunk start (`e^{b_r} ≤ 1`):
/// the decayed queries and keys; against the chunk end, `k_to_end` (≤ 1) and its transpose;
/// and the whole chunk's decay. Each factor is its own exponent (≤ 0).
#[inline(always)]
fn row_factors(isa: Isa, inp: &ChunkIn<'_>, sc: &mut Scratch<'_>) -> Result<(), KdaError> {
    let (kd, l) = (inp.kd, inp.l);
    let (bh, bl) = (&sc.cum_hi[..l * kd], &sc.cum_lo[..l * kd]);
    let (qg, kgam) = sc.decayed[..2 * l * kd].split_at_mut(l * kd);
    let kg = &mut sc.k_to_end[..l * kd];
    for r in 0..l {
        let row = r * kd..(r + 1) * kd;
        let (qgr, kgr) = (&mut qg[row.clone()], &mut kg[row.clone()]);
        for ((o, a), b) in qgr.iter_mut().zip(&bh[row.clone()]).zip(&bl[row.clone()]) {
            *o = a + b;
        }
        diff_row(kgr, bh, bl, l - 1, r, kd);
        simd::exp_in_place(isa, qgr);
        simd::exp_in_place(isa, kgr);
        let (qr, kr) = (inp.q.row(r), inp.k.row(r));
        for ((((qg, kgam), kg), &qv), &kv) in qgr
            .iter_mut()
            .zip(&mut kgam[row])
            .zip(kgr.iter_mut())
            .zip(qr)
            .zip(kr)
        {
            let gm = *qg;
            *kgam = kv * gm;
            *qg = inp.scale * qv * gm;
            *kg *= kv;
        }
    }
    simd::transpose(isa, l, kd, kg, kd, &mut sc.k_to_end_t[..kd * l], l)?;
    let last = (l - 1) * kd..l * kd;
    let ex = &mut *sc.chunk_decay;
    for ((o, a), b) in ex.iter_mut().zip(&bh[last.clone()]).zip(&bl[last]) {
        *o = a + b;
    }
    simd::exp_in_place(isa, ex);
    Ok(())
}

/// Step 3 of a chunk that is not tame: `A_qk` (scaled, `j ≤ i`) and `−A_kk` (β-scaled rows,
/// `j < i`), by 16-row blocks.
#[inline(always)]
fn intra_chunk_matrices(isa: Isa, inp: &ChunkIn<'_>, sc: &mut Scratch<'_>) -> Result<(), KdaError> {
    let l = inp.l;
    sc.a[..2 * l * l].fill(0.0);
    for (a0, a1) in sub_blocks(l) {
        block_products(isa, inp, sc, (a0, a1))?;
        scale_and_mask(inp, sc, a0, a1);
    }
    Ok(())
}

/// Rows `a0..a1` of `A_qk` and `A_kk` (unscaled): a GEMM against every earlier row, and the
/// diagonal block factorised around row `a0` when its decay spread allows, else per-pair
/// exponents (each ≤ 0).
#[inline(always)]
fn block_products(
    isa: Isa,
    inp: &ChunkIn<'_>,
    sc: &mut Scratch<'_>,
    (a0, a1): (usize, usize),
) -> Result<(), KdaError> {
    let (q, k, kd, l) = (inp.q, inp.k, inp.kd, inp.l);
    let rows = a1 - a0;
    let (bh, bl) = (&sc.cum_hi[..l * kd], &sc.cum_lo[..l * kd]);
    let factorised = max_diff(bh, bl, a0, a1 - 1, kd) <= MAX_SPREAD;
    // Columns covered by the product: all earlier rows, plus this block when factorised.
    let cols = if factorised { a1 } else { a0 };
    let (qt, kt) = (&mut sc.q_block[..rows * kd], &mut sc.k_block[..rows * kd]);
    for i in a0..a1 {
        // e^{b_i − b_{a0}}
        let rr = (i - a0) * kd..(i - a0 + 1) * kd;
        diff_row(&mut qt[rr.clone()], bh, bl, i, a0, kd);
        simd::exp_in_place(isa, &mut qt[rr.clone()]);
        let (qi, ki) = (q.row(i), k.row(i));
        for (((qt, kt), &qv), &kv) in qt[rr.clone()].iter_mut().zip(&mut kt[rr]).zip(qi).zip(ki) {
            let f = *qt;
            *qt = qv * f;
            *kt = kv * f;
        }
    }
    let (aqk, nakk) = split_a(sc.a, l);
    if cols > 0 {
        // k̂ [cols, K]: k_j ⊙ e^{b_{a0} − b_j}, then transposed to [K, cols].
        let kh = &mut sc.k_to_end[..cols * kd];
        for j in 0..cols {
            let khr = &mut kh[j * kd..(j + 1) * kd];
            diff_row(khr, bh, bl, a0, j, kd);
            simd::exp_in_place(isa, khr);
            for (o, &kv) in khr.iter_mut().zip(k.row(j)) {
                *o *= kv;
            }
        }
        let kht = &mut sc.k_hat_t[..kd * cols];
        simd::transpose(isa, cols, kd, kh, kd, kht, cols)?;
        let kht = &*kht;
        simd::gemm_acc(
            isa,
            rows,
            cols,
            kd,
            qt,
            kd,
            kht,
            cols,
            &mut aqk[a0 * l..],
            l,
        )?;
        simd::gemm_acc(
            isa,
            rows,
            cols,
            kd,
            kt,
            kd,
            kht,
            cols,
            &mut nakk[a0 * l..],
            l,
        )?;
    }
    if !factorised {
        diagonal_per_pair(inp, (bh, bl), aqk, nakk, a0, a1);
    }
    Ok(())
}

/// The diagonal block `a0..a1` of `A_qk` and `A_kk` with one exponent per pair (each ≤ 0):
/// the fallback when the block's decay spread is too wide to factorise.
#[inline(always)]
fn diagonal_per_pair(
    inp: &ChunkIn<'_>,
    (bh, bl): (&[f32], &[f32]),
    aqk: &mut [f32],
    nakk: &mut [f32],
    a0: usize,
    a1: usize,
) {
    let (kd, l) = (inp.kd, inp.l);
    for i in a0..a1 {
        let (qi, ki) = (inp.q.row(i), inp.k.row(i));
        for j in a0..=i {
            let kj = inp.k.row(j);
            let (mut sq, mut sk) = (0.0f32, 0.0f32);
            for d in 0..kd {
                let e = libm::expf(diff(bh, bl, i, j, d, kd));
                sq += qi[d] * kj[d] * e;
                sk += ki[d] * kj[d] * e;
            }
            aqk[i * l + j] = sq;
            nakk[i * l + j] = sk;
        }
    }
}

/// `A_qk` and `−A_kk`, each `[l, l]`, out of their stacked buffer.
#[inline(always)]
fn split_a(a: &mut [f32], l: usize) -> (&mut [f32], &mut [f32]) {
    a[..2 * l * l].split_at_mut(l * l)
}

/// Rows `a0..a1`: `A_qk` scaled and cut to `j ≤ i`; `A_kk` times `−β_i` and cut to `j < i`.
#[inline(always)]
fn scale_and_mask(inp: &ChunkIn<'_>, sc: &mut Scratch<'_>, a0: usize, a1: usize) {
    let l = inp.l;
    let (aqk, nakk) = split_a(sc.a, l);
    for i in a0..a1 {
        let nb = -inp.beta.at(i);
        let qa = &mut aqk[i * l..(i + 1) * l];
        let na = &mut nakk[i * l..(i + 1) * l];
        for (j, (x, y)) in qa.iter_mut().zip(na.iter_mut()).enumerate() {
            *x = if j <= i { *x * inp.scale } else { 0.0 };
            *y = if j < i { *y * nb } else { 0.0 };
        }
    }
}

/// Step 4: both products with the initial state in one GEMM: `q_decayed·S₀` (the outputs'
/// first term) and `k_decayed·S₀` (for the right-hand side), stacked in `out_delta`.
#[inline(always)]
fn state_products(
    isa: Isa,
    inp: &ChunkIn<'_>,
    state: &[f32],
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    let (kd, vd, l) = (inp.kd, inp.vd, inp.l);
    let od = &mut sc.out_delta[..2 * l * vd];
    let qk = (&sc.decayed[..2 * l * kd], kd);
    let shape = (2 * l, vd, kd);
    simd::gemm_queued(isa, CStart::Zero, shape, qk, (state, vd), (od, vd), queue)
}

/// Step 5: the right-hand side `R = diag(β)(V − k_decayed·S₀)`, then `Δ = (I + A_kk)⁻¹ R` by
/// blockwise forward substitution, in place.
#[inline(always)]
fn innovations(isa: Isa, inp: &ChunkIn<'_>, sc: &mut Scratch<'_>) -> Result<(), KdaError> {
    let (vd, l) = (inp.vd, inp.l);
    let r = &mut sc.out_delta[l * vd..2 * l * vd];
    let nakk = &sc.a[l * l..2 * l * l];
    for (i, rr) in r.chunks_exact_mut(vd).enumerate() {
        let b = inp.beta.at(i);
        for (x, &v) in rr.iter_mut().zip(inp.v.row(i)) {
            *x = b * (v - *x);
        }
    }
    for (a0, a1) in sub_blocks(l) {
        if a0 > 0 {
            let (done, cur) = r.split_at_mut(a0 * vd);
            simd::gemm_acc(isa, a1 - a0, vd, a0, &nakk[a0 * l..], l, done, vd, cur, vd)?;
        }
        for i in a0 + 1..a1 {
            let (done, cur) = r.split_at_mut(i * vd);
            let coef = &nakk[i * l + a0..i * l + i];
            accumulate_rows(&mut cur[..vd], coef, &done[a0 * vd..], vd);
        }
    }
    Ok(())
}

/// Columns `accumulate_rows` keeps in registers at a time.
const ACC_COLS: usize = 64;

/// `cur += Σ_j coef[j] · rows[j]` over rows of `vd` (`rows` holds at least `coef.len()`), by
/// blocks of [`ACC_COLS`] columns held in registers over all `j`: one load and one
/// multiply-add per term instead of a load, multiply-add and store of `cur` per row.
#[inline(always)]
fn accumulate_rows(cur: &mut [f32], coef: &[f32], rows: &[f32], vd: usize) {
    let mut c0 = 0;
    while let Some(acc) = cur[c0..].first_chunk_mut::<ACC_COLS>() {
        let mut sum = *acc;
        for (&a, row) in coef.iter().zip(rows.chunks_exact(vd)) {
            if let Some(x) = row[c0..].first_chunk::<ACC_COLS>() {
                for (s, &x) in sum.iter_mut().zip(x) {
                    *s += a * x;
                }
            }
        }
        *acc = sum;
        c0 += ACC_COLS;
    }
    for (&a, row) in coef.iter().zip(rows.chunks_exact(vd)) {
        for (s, &x) in cur[c0..].iter_mut().zip(&row[c0..]) {
            *s += a * x;
        }
    }
}

/// Step 6: `O = q_decayed·S₀ + A_qk·Δ`. `A_qk` is lower triangular, so each 16-row block uses
/// the columns up to its end in one GEMM; if `Δ` holds a NaN or ±∞, the diagonal blocks go
/// row by row over `j ≤ i` instead, so that a bad token never reaches the rows before it
/// (`0 · NaN` would).
#[inline(always)]
fn chunk_outputs(
    isa: Isa,
    inp: &ChunkIn<'_>,
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    let (vd, l) = (inp.vd, inp.l);
    let aqk = &sc.a[..l * l];
    let (o, delta) = sc.out_delta[..2 * l * vd].split_at_mut(l * vd);
    let delta = &*delta;
    let finite = all_finite(delta);
    for (a0, a1) in sub_blocks(l) {
        let cols = if finite { a1 } else { a0 };
        simd::gemm_queued(
            isa,
            CStart::Keep,
            (a1 - a0, vd, cols),
            (&aqk[a0 * l..], l),
            (delta, vd),
            (&mut o[a0 * vd..], vd),
            queue,
        )?;
        if !finite {
            for i in a0..a1 {
                let oi = &mut o[i * vd..(i + 1) * vd];
                for j in a0..=i {
                    simd::axpy(isa, aqk[i * l + j], &delta[j * vd..(j + 1) * vd], oi);
                }
            }
        }
    }
    Ok(())
}

/// Whether every element is finite: no exponent field is all ones (an integer OR-reduction,
/// which vectorises; a float reduction would be one serial chain).
#[inline(always)]
fn all_finite(x: &[f32]) -> bool {
    const EXP: u32 = 0x7f80_0000;
    !x.iter()
        .fold(false, |any, &v| any | (v.to_bits() & EXP == EXP))
}

/// Step 7: `S ← diag(e^{b_{l−1}}) S + k_to_endᵀ Δ`.
#[inline(always)]
fn update_state(
    isa: Isa,
    inp: &ChunkIn<'_>,
    state: &mut [f32],
    sc: &mut Scratch<'_>,
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    let (kd, vd, l) = (inp.kd, inp.vd, inp.l);
    let delta = &sc.out_delta[l * vd..2 * l * vd];
    // 16 key rows at a time, each row scaled by its decay as the product stores it (one GEMM
    // over all K rows, column panels outer, was measured 5 % slower on AVX2: the state's
    // rows are 512 B apart there); all rows in one call where the product goes by row blocks
    // anyway.
    let group = if simd::short_gemm(isa, l, vd) {
        kd
    } else {
        SUB
    };
    for d0 in (0..kd).step_by(group) {
        let d1 = (d0 + group).min(kd);
        let rows = &mut state[d0 * vd..d1 * vd];
        let decay = CStart::ScaledRows(&sc.chunk_decay[d0..d1]);
        let kt = (&sc.k_to_end_t[d0 * l..d1 * l], l);
        let shape = (d1 - d0, vd, l);
        simd::gemm_queued(isa, decay, shape, kt, (delta, vd), (rows, vd), queue)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::recurrent::{recurrent_head, recurrent_scratch_len};
    use crate::ops::HeadRows;
    use std::vec::Vec;

    struct Case {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        s0: Vec<f32>,
    }

    use crate::test_rng::uniform as rng;

    fn unit_rows(x: &mut [f32], kd: usize) {
        for r in x.chunks_mut(kd) {
            let n = r.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            r.iter_mut().for_each(|v| *v /= n);
        }
    }

    /// `gate`: 0 = logsigmoid-like small decays, 1 = with −1000 resets, 2 = large softplus-like.
    fn case(t: usize, kd: usize, vd: usize, gate: u8, seed: u64) -> Case {
        let mut s = seed;
        let mut q: Vec<f32> = (0..t * kd).map(|_| rng(&mut s)).collect();
        let mut k: Vec<f32> = (0..t * kd).map(|_| rng(&mut s)).collect();
        unit_rows(&mut q, kd);
        unit_rows(&mut k, kd);
        let v = (0..t * vd).map(|_| rng(&mut s)).collect();
        let g = (0..t * kd)
            .map(|_| {
                let u = rng(&mut s);
                match gate {
                    0 => -0.05 * (1.0 + u),
                    1 if u > 0.97 => -1000.0,
                    1 => -0.1 * (1.0 + u),
                    _ => -8.0 * (1.0 + u) * (1.0 + u),
                }
            })
            .collect();
        let beta = (0..t).map(|_| 0.5 + 0.5 * rng(&mut s)).collect();
        let s0 = (0..kd * vd).map(|_| 0.5 * rng(&mut s)).collect();
        Case {
            q,
            k,
            v,
            g,
            beta,
            s0,
        }
    }

    fn rel(a: &[f32], b: &[f32]) -> f64 {
        let n: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let d: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (n / d.max(1e-300)).sqrt()
    }

    /// The case through `run`: its outputs and final state.
    fn outputs(
        c: &Case,
        kd: usize,
        run: impl FnOnce(HeadRows<'_>) -> Result<(), KdaError>,
    ) -> (Vec<f32>, Vec<f32>) {
        let (mut v, mut s) = (c.v.clone(), c.s0.clone());
        let rows = HeadRows {
            q: &c.q,
            k: &c.k,
            g: &c.g,
            beta: &c.beta,
            v_o: &mut v,
            state: &mut s,
            scale: 1.0 / (kd as f32).sqrt(),
        };
        run(rows).unwrap();
        (v, s)
    }

    /// The recurrence's outputs and final state (portable path).
    fn recurrent(c: &Case, kd: usize, vd: usize) -> (Vec<f32>, Vec<f32>) {
        let mut scr = std::vec![0.0; recurrent_scratch_len(kd, vd)];
        outputs(c, kd, |rows| recurrent_head(Isa::Portable, rows, &mut scr))
    }

    /// The chunked kernel's outputs and final state.
    fn chunked(c: &Case, kd: usize, vd: usize, chunks: Chunks, isa: Isa) -> (Vec<f32>, Vec<f32>) {
        let mut scr = std::vec![0.0; chunked_scratch_len(chunks.size, kd, vd)];
        outputs(c, kd, |rows| chunked_head(isa, rows, chunks, &mut scr))
    }

    fn run_both(
        c: &Case,
        kd: usize,
        vd: usize,
        chunk: usize,
        first: usize,
        isa: Isa,
    ) -> (f64, f64) {
        let (vr, sr) = recurrent(c, kd, vd);
        let (vc, scc) = chunked(c, kd, vd, Chunks { size: chunk, first }, isa);
        assert!(
            vc.iter().chain(&scc).all(|x| x.is_finite()),
            "non-finite chunked result"
        );
        (rel(&vc, &vr), rel(&scc, &sr))
    }

    #[test]
    fn chunked_equals_recurrent_across_shapes_gates_and_paths() {
        for isa in Isa::all_supported() {
            for &(t, kd, chunk) in &[
                (1usize, 16usize, 16usize),
                (15, 16, 16),
                (17, 32, 16),
                (63, 32, 32),
                (65, 64, 64),
                (200, 16, 64),
                (130, 128, 64),
                (100, 8, 32),
            ] {
                for gate in 0..3u8 {
                    let c = case(t, kd, kd, gate, (t * 31 + kd + gate as usize) as u64);
                    let (eo, es) = run_both(&c, kd, kd, chunk, chunk, isa);
                    assert!(
                        eo <= 1e-5 && es <= 1e-5,
                        "{isa:?} T{t} K{kd} C{chunk} gate{gate}: o {eo:.2e} S {es:.2e}"
                    );
                }
            }
        }
    }

    #[test]
    fn first_chunk_length_and_value_dim_differ() {
        let c = case(50, 16, 24, 1, 7);
        for first in [1usize, 5, 16] {
            let (eo, es) = run_both(&c, 16, 24, 16, first, Isa::detect());
            assert!(eo <= 1e-5 && es <= 1e-5, "first {first}: {eo:.2e} {es:.2e}");
        }
    }

    /// A NaN in any input of token 3 of 17 leaves the outputs of tokens 0–2 finite and equal
    /// to the recurrence's, and poisons tokens 3–16 in both forms.
    #[test]
    fn nan_reaches_no_earlier_token() {
        let (t, kd) = (17usize, 16usize);
        for isa in Isa::all_supported() {
            for input in 0..5 {
                let mut c = case(t, kd, kd, 0, 11);
                let bad = 3;
                match input {
                    0 => c.q[bad * kd + 2] = f32::NAN,
                    1 => c.k[bad * kd + 5] = f32::NAN,
                    2 => c.v[bad * kd] = f32::NAN,
                    3 => c.g[bad * kd + 1] = f32::NAN,
                    _ => c.beta[bad] = f32::NAN,
                }
                let (vr, _) = recurrent(&c, kd, kd);
                for chunk in [4usize, 16, 64] {
                    let (vc, _) = chunked(&c, kd, kd, Chunks::of(chunk), isa);
                    let early = ..bad * kd;
                    assert!(
                        vc[early].iter().all(|x| x.is_finite()),
                        "{isa:?} in{input} C{chunk}"
                    );
                    let e = rel(&vc[early], &vr[early]);
                    assert!(e <= 1e-5, "{isa:?} input {input} C{chunk}: {e:.2e}");
                    // The bad token's output row has a NaN in both forms (its whole row unless
                    // only q was bad, which reaches its own output alone).
                    let row = bad * kd..(bad + 1) * kd;
                    assert!(
                        vr[row.clone()].iter().any(|x| x.is_nan()),
                        "recurrent in{input}"
                    );
                    assert!(
                        vc[row].iter().any(|x| x.is_nan()),
                        "{isa:?} in{input} C{chunk}"
                    );
                    let later = (bad + 1) * kd..;
                    let nan_r = vr[later.clone()].iter().filter(|x| x.is_nan()).count();
                    let nan_c = vc[later].iter().filter(|x| x.is_nan()).count();
                    assert_eq!(
                        nan_c, nan_r,
                        "{isa:?} in{input} C{chunk}: NaNs after the bad token"
                    );
                }
            }
        }
    }

    /// `x` `[T, dim]` as head `h` of a `[T, heads, dim]` buffer (the other heads hold junk).
    fn as_head(x: &[f32], dim: usize, heads: usize, h: usize) -> Vec<f32> {
        let t = x.len() / dim;
        let mut out = std::vec![f32::NAN; t * heads * dim];
        for (r, row) in x.chunks_exact(dim).enumerate() {
            out[(r * heads + h) * dim..][..dim].copy_from_slice(row);
        }
        out
    }

    /// Rows read in place out of `[T, H, ·]` buffers give bit for bit the outputs and state of
    /// the contiguous call, handed over chunk by chunk in order, on every path and chunk grid.
    #[test]
    fn strided_rows_equal_contiguous_rows() {
        let (t, kd, vd, heads, h) = (50usize, 16usize, 24usize, 3usize, 1usize);
        for gate in 0..3u8 {
            let c = case(t, kd, vd, gate, 5 + gate as u64);
            let (q, k, g) = (
                as_head(&c.q, kd, heads, h),
                as_head(&c.k, kd, heads, h),
                as_head(&c.g, kd, heads, h),
            );
            let (v, beta) = (as_head(&c.v, vd, heads, h), as_head(&c.beta, 1, heads, h));
            fn rows(x: &[f32], dim: usize, heads: usize, h: usize) -> StridedRows<'_> {
                StridedRows {
                    data: &x[h * dim..],
                    dim,
                    stride: heads * dim,
                }
            }
            for isa in Isa::all_supported() {
                for chunks in [
                    Chunks::of(16),
                    Chunks { size: 16, first: 5 },
                    Chunks::of(64),
                ] {
                    let (want_o, want_s) = chunked(&c, kd, vd, chunks, isa);
                    let mut scr = std::vec![0.0; chunked_scratch_len(chunks.size, kd, vd)];
                    // Rows to prefetch for what runs next (head 0's, more tokens than the
                    // buffers hold: the queue leaves out what does not fit) change nothing.
                    let head_rows = |tokens, h| StridedInputs {
                        tokens,
                        q: rows(&q, kd, heads, h),
                        k: rows(&k, kd, heads, h),
                        g: rows(&g, kd, heads, h),
                        beta: rows(&beta, 1, heads, h),
                        v: rows(&v, vd, heads, h),
                    };
                    // Destination rows to prefetch (the outputs' rows in a `[T, H, V]`
                    // buffer, or an address far off: only hinted) change nothing either.
                    let dest = std::vec![0.0f32; t * heads * vd];
                    let hints = [
                        None,
                        Some(RowsHint::of(&dest[h * vd..], vd, heads * vd)),
                        Some(RowsHint {
                            start: usize::MAX - 64,
                            dim: vd,
                            stride: usize::MAX / 3,
                        }),
                    ];
                    let runs = [None, Some(head_rows(2 * t, 0))]
                        .into_iter()
                        .flat_map(|next| hints.map(|out_rows| (next, out_rows)));
                    for (next, out_rows) in runs {
                        let mut state = c.s0.clone();
                        let head = StridedHead {
                            inputs: head_rows(t, h),
                            state: &mut state,
                            scale: 1.0 / (kd as f32).sqrt(),
                            next,
                            out_rows,
                        };
                        let mut o = Vec::new();
                        chunked_head_strided(isa, head, chunks, &mut scr, |t0, rows| {
                            assert_eq!(t0 * vd, o.len(), "chunks out of order");
                            assert_eq!(rows.len() % vd, 0);
                            o.extend_from_slice(rows);
                        })
                        .unwrap();
                        let what = format!(
                            "{isa:?} gate {gate} {chunks:?} next {} {out_rows:?}",
                            next.is_some()
                        );
                        assert_eq!(o, want_o, "{what}");
                        assert_eq!(state, want_s, "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn strided_bad_arguments_are_errors() {
        let c = case(4, 8, 8, 0, 1);
        let rows = |x| StridedRows::contiguous(x, 8);
        let mut scr = std::vec![0.0; chunked_scratch_len(16, 8, 8)];
        let mut run = |tokens: usize, q: StridedRows<'_>, beta: StridedRows<'_>, state_len| {
            let mut state = std::vec![0.0; state_len];
            let head = StridedHead {
                inputs: StridedInputs {
                    tokens,
                    q,
                    k: rows(&c.k),
                    g: rows(&c.g),
                    beta,
                    v: rows(&c.v),
                },
                state: &mut state,
                scale: 1.0,
                next: None,
                out_rows: None,
            };
            let mut calls = 0;
            let r = chunked_head_strided(Isa::Portable, head, Chunks::of(16), &mut scr, |_, _| {
                calls += 1
            });
            (r, calls)
        };
        let beta = StridedRows::contiguous(&c.beta, 1);
        assert_eq!(run(4, rows(&c.q), beta, 64), (Ok(()), 1));
        // No tokens: nothing runs, nothing is handed out.
        assert_eq!(run(0, rows(&c.q), beta, 64), (Ok(()), 0));
        let e = run(5, rows(&c.q), beta, 64).0;
        assert!(
            matches!(e, Err(KdaError::TooSmall { arg: "q", .. })),
            "{e:?}"
        );
        let narrow = StridedRows {
            stride: 4,
            ..rows(&c.q)
        };
        let e = run(4, narrow, beta, 64).0;
        assert!(
            matches!(
                e,
                Err(KdaError::Config {
                    field: "stride",
                    ..
                })
            ),
            "{e:?}"
        );
        let short_k = StridedRows::contiguous(&c.q, 4);
        let e = run(4, short_k, beta, 64).0;
        assert!(matches!(e, Err(KdaError::Shape { arg: "k", .. })), "{e:?}");
        let e = run(4, rows(&c.q), StridedRows::contiguous(&c.beta, 2), 64).0;
        assert!(
            matches!(e, Err(KdaError::Shape { arg: "beta", .. })),
            "{e:?}"
        );
        let e = run(4, rows(&c.q), beta, 63).0;
        assert!(
            matches!(e, Err(KdaError::Length { arg: "state", .. })),
            "{e:?}"
        );
    }

    #[test]
    fn bad_arguments_are_errors() {
        let c = case(4, 8, 8, 0, 1);
        let (mut v, mut s) = (c.v.clone(), c.s0.clone());
        let mut scr = std::vec![0.0; 10];
        let mut run = |q: &[f32], chunks: Chunks| {
            let rows = HeadRows {
                q,
                k: &c.k,
                g: &c.g,
                beta: &c.beta,
                v_o: &mut v,
                state: &mut s,
                scale: 1.0,
            };
            chunked_head(Isa::Portable, rows, chunks, &mut scr)
        };
        let e = run(&c.q, Chunks::of(16));
        assert!(matches!(e, Err(KdaError::TooSmall { .. })), "{e:?}");
        let e = run(&c.q, Chunks { size: 0, first: 1 });
        assert!(matches!(e, Err(KdaError::Config { .. })), "{e:?}");
        let e = run(&c.q[1..], Chunks::of(16));
        assert!(matches!(e, Err(KdaError::Length { .. })), "{e:?}");
    }
}
