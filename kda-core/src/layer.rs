//! The whole layer: sequence forward (prefill) and decode step, with their workspace sizes.
//!
//! Per token, in order (spec §9.2):
//! projections → short convs (+SiLU) → decay gate, beta → q/k L2 norm → delta rule
//! (token-by-token recurrence or chunked) → gated RMSNorm → `o_proj`.
//!
//! **Blocks.** Tokens are processed in blocks; the workspace holds one block's intermediates
//! (and each worker's scratch), and the caller picks the block size by the workspace it passes
//! ([`workspace_len`]). The caches carry everything from one block to the next. In recurrent
//! mode the result does not depend on the block size at all (bitwise); in chunked mode block
//! ends are moved onto the sequence's chunk grid, so any block of at least `chunk_size` tokens
//! gives bitwise the same result too.
//!
//! **Tasks.** Each block runs as three rounds of independent tasks on an [`Executor`]:
//! projection tiles (16 output rows each), one task per (sequence, head) for conv → norm →
//! delta rule → gated norm, then `o_proj` tiles. Results are bitwise identical for any number
//! of threads. Intermediates are head-major (`[H, B, K]`) so each (sequence, head) task owns
//! contiguous rows.

use crate::cache::CachesMut;
use crate::config::KdaConfig;
use crate::error::{add, check_len, mul, KdaError};
use crate::exec::{Executor, Failed, Serial, Shared};
use crate::math::sigmoid;
use crate::ops::chunked::{chunked_head, chunked_scratch_len, MAX_CHUNK};
use crate::ops::conv::{short_conv_prefill, short_conv_prefill_scratch};
use crate::ops::gate::decay_one;
use crate::ops::linear::{project_scratch_len, project_tile, PROJECT_DIRECT_MAX, PROJECT_TOKENS};
use crate::ops::norm::{gated_rms_norm_row_into_gate, l2_norm};
use crate::ops::recurrent::{recurrent_head, recurrent_scratch_len};
use crate::simd::Isa;
use crate::weights::{Data, GateWeights, KdaWeights, MatRef};

/// Where a forward call's caches start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialCaches {
    /// Every sequence starts fresh: the caches are zeroed first (their contents are ignored).
    Zero,
    /// The caches hold each sequence's state so far (a continuation, or a prefix cache).
    /// To start some sequences fresh and continue others, zero the former with
    /// [`CachesMut::reset_sequence`] and pass `Given`.
    Given,
}

/// How the delta rule runs over a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Chunked for sequences of at least [`AUTO_CHUNK_MIN_TOKENS`] tokens, else recurrent.
    Auto,
    /// Token by token (what decode always uses).
    Recurrent,
    /// The chunked (WY/UT) form.
    Chunked,
}

/// Default chunk size, chosen by measurement (`cargo bench -p kda-core --bench delta_rule`,
/// AMD EPYC with AVX2+FMA, one thread, K = V = 128): at T = 4096, C = 16 runs at ~61 % of the
/// FMA peak, C = 32 at ~58 %, C = 64 at ~50 %. The state products are efficient GEMMs at any
/// of these sizes, so the per-token intra-chunk work, which grows with C, decides.
pub const DEFAULT_CHUNK: usize = 16;

/// In [`Mode::Auto`], sequences at least this long run chunked. Measured (same machine,
/// K ∈ {16, 32, 64, 128}, chunk 16): the chunked kernel is slower than the recurrence for 2–4
/// tokens (by up to 1.4×) and faster from 8 tokens on (0.4–0.8× the time).
pub const AUTO_CHUNK_MIN_TOKENS: usize = 8;

/// Options of a forward call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardOptions {
    /// Recurrent, chunked, or chosen by length.
    pub mode: Mode,
    /// Chunk size for the chunked form (1..=256; 16, 32, 64 are typical).
    pub chunk_size: usize,
    /// Kernel path; `None` picks the fastest this CPU supports.
    pub isa: Option<Isa>,
}

impl Default for ForwardOptions {
    fn default() -> Self {
        ForwardOptions {
            mode: Mode::Auto,
            chunk_size: DEFAULT_CHUNK,
            isa: None,
        }
    }
}

impl ForwardOptions {
    /// Token-by-token only.
    pub fn recurrent() -> Self {
        ForwardOptions {
            mode: Mode::Recurrent,
            ..Self::default()
        }
    }

    fn validate(&self) -> Result<Isa, KdaError> {
        if self.chunk_size == 0 || self.chunk_size > MAX_CHUNK {
            return Err(KdaError::Config {
                field: "chunk_size",
                reason: "must be between 1 and 256",
            });
        }
        match self.isa {
            None => Ok(Isa::detect()),
            Some(i) if i.is_supported() => Ok(i),
            Some(_) => Err(KdaError::Config {
                field: "isa",
                reason: "not supported by this CPU",
            }),
        }
    }

    /// Whether a sequence of `len` tokens runs chunked.
    fn chunks(&self, len: usize) -> bool {
        match self.mode {
            Mode::Recurrent => false,
            Mode::Chunked => true,
            Mode::Auto => len >= AUTO_CHUNK_MIN_TOKENS,
        }
    }
}

fn ranks(cfg: &KdaConfig) -> (usize, usize) {
    (cfg.decay_proj.rank(), cfg.output_gate.rank())
}

/// f32 elements of workspace per token of a block: q, k, v, g, output gate (`H·K` each),
/// beta (`H`) and the low-rank bottlenecks.
pub(crate) fn per_token_workspace(cfg: &KdaConfig) -> Result<usize, KdaError> {
    let d = cfg.proj_dim_checked()?;
    let (rf, rg) = ranks(cfg);
    let w = add("workspace", mul("workspace", 5, d)?, cfg.heads)?;
    add("workspace", w, add("workspace", rf, rg)?)
}

/// f32 elements of scratch per worker. The projection rounds and the (sequence, head) round
/// never overlap, so the region serves both: the conv's `W−1`, the recurrence's and (when it may
/// run) the chunked kernel's scratch, or the projection scratch: [`PROJECT_MIN`] when a block
/// has at most [`PROJECT_DIRECT_MAX`] tokens (the projections read the weight rows directly),
/// else room to pack a tile's weight rows whole for blocks of `block` tokens.
fn per_worker(cfg: &KdaConfig, chunk: Option<usize>, block: usize) -> Result<usize, KdaError> {
    let k = cfg.head_dim;
    let rec = add(
        "workspace",
        recurrent_scratch_len(k, k),
        short_conv_prefill_scratch(cfg.conv_width),
    )?;
    let seq_head = match chunk {
        None => rec,
        Some(c) => add("workspace", rec, chunked_scratch_len(c, k, k))?,
    };
    let proj = if block > PROJECT_DIRECT_MAX {
        let (rf, rg) = ranks(cfg);
        let widest = cfg.hidden.max(cfg.proj_dim_checked()?).max(rf).max(rg);
        project_scratch_len(widest, block).max(PROJECT_MIN)
    } else {
        PROJECT_MIN
    };
    Ok(seq_head.max(proj))
}

/// Smallest projection scratch per worker (1.5 KB): enough for blocks the projections run
/// straight from the weight rows (decode).
const PROJECT_MIN: usize = 4 * 96;

/// f32 elements of workspace for a forward with `opts`, processing up to `block_tokens` tokens
/// at a time on an executor with `workers` workers. (Any `block_tokens ≥ 1` gives a correct
/// result; larger blocks reuse each weight row more.) With [`Mode::Auto`], chunk scratch is
/// included only when `block_tokens` reaches [`AUTO_CHUNK_MIN_TOKENS`]: pass the longest
/// sequence length (or more) as `block_tokens` if the block may be smaller than a sequence.
pub fn workspace_len(
    cfg: &KdaConfig,
    opts: &ForwardOptions,
    block_tokens: usize,
    workers: usize,
) -> Result<usize, KdaError> {
    cfg.validate()?;
    opts.validate()?;
    let chunk = opts.chunks(block_tokens).then_some(opts.chunk_size);
    let per = mul("workspace", per_token_workspace(cfg)?, block_tokens.max(1))?;
    let wk = mul(
        "workspace",
        per_worker(cfg, chunk, block_tokens.max(1))?,
        workers.max(1),
    )?;
    add("workspace", per, wk)
}

/// Workspace for [`forward`] (default options, one worker) with blocks of up to
/// `block_tokens` tokens.
pub fn forward_workspace_len(cfg: &KdaConfig, block_tokens: usize) -> Result<usize, KdaError> {
    workspace_len(cfg, &ForwardOptions::default(), block_tokens, 1)
}

/// Workspace for a [`decode_step`] over `batch` sequences in one block (a smaller workspace,
/// down to one sequence's worth, also works, in more blocks).
pub fn decode_workspace_len(cfg: &KdaConfig, batch: usize) -> Result<usize, KdaError> {
    workspace_len(cfg, &ForwardOptions::recurrent(), batch, 1)
}

/// Checks `cu_seqlens` (`[N+1]`, starts at 0, non-decreasing, ends at `tokens`); returns `N`.
pub fn validate_offsets(cu_seqlens: &[usize], tokens: usize) -> Result<usize, KdaError> {
    let bad = |reason| Err(KdaError::Offsets { reason });
    let (Some(&first), Some(&last)) = (cu_seqlens.first(), cu_seqlens.last()) else {
        return bad("is empty (needs at least [0, T])");
    };
    if cu_seqlens.len() < 2 {
        return bad("needs at least two entries [0, T]");
    }
    if first != 0 {
        return bad("must start at 0");
    }
    if cu_seqlens.windows(2).any(|p| p[1] < p[0]) {
        return bad("must be non-decreasing");
    }
    if last != tokens {
        return bad("must end at the number of tokens (rows of x)");
    }
    Ok(cu_seqlens.len() - 1)
}

fn rows_of(arg: &'static str, len: usize, width: usize) -> Result<usize, KdaError> {
    if len % width != 0 {
        return Err(KdaError::Length {
            arg,
            expected: len - len % width,
            actual: len,
        });
    }
    Ok(len / width)
}

/// Runs the layer over `T` tokens of `N` packed sequences with default options on the calling
/// thread. See [`forward_with`].
#[allow(clippy::too_many_arguments)]
pub fn forward(
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    cu_seqlens: &[usize],
    caches: CachesMut<'_>,
    init: InitialCaches,
    out: &mut [f32],
    workspace: &mut [f32],
) -> Result<(), KdaError> {
    let opts = ForwardOptions::default();
    forward_with(
        cfg, w, x, cu_seqlens, caches, init, out, workspace, &opts, &Serial,
    )
}

/// Runs the layer over `T` tokens of `N` packed sequences.
///
/// * `x`: `[T, hidden]` input rows; `out`: `[T, hidden]` output rows.
/// * `cu_seqlens`: `[N+1]` offsets; sequence `n` is rows `cu[n]..cu[n+1]` (may be empty).
/// * `caches`: the `N` sequences' caches, read as initial caches when `init` is
///   [`InitialCaches::Given`] and always left holding the final caches.
/// * `workspace`: at least [`workspace_len`]`(cfg, opts, 1, exec.workers())` elements (with
///   `block_tokens` covering the longest sequence in [`Mode::Auto`]); the block size is
///   whatever fits.
///
/// Every length, shape and offset is checked before anything is written. NaN or ±∞ in the
/// inputs, weights or caches propagate to the outputs; they never cause a panic.
#[allow(clippy::too_many_arguments)]
pub fn forward_with(
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    cu_seqlens: &[usize],
    mut caches: CachesMut<'_>,
    init: InitialCaches,
    out: &mut [f32],
    workspace: &mut [f32],
    opts: &ForwardOptions,
    exec: &dyn Executor,
) -> Result<(), KdaError> {
    w.validate(cfg)?;
    let isa = opts.validate()?;
    let t_len = rows_of("x", x.len(), cfg.hidden)?;
    check_len("out", out.len(), x.len())?;
    let n = validate_offsets(cu_seqlens, t_len)?;
    caches.validate(cfg, n)?;
    let longest = cu_seqlens
        .windows(2)
        .map(|p| p[1] - p[0])
        .max()
        .unwrap_or(0);
    let chunk = opts.chunks(longest).then_some(opts.chunk_size);
    let (block, wk_len) = block_tokens(cfg, workspace.len(), t_len, chunk, exec.workers())?;
    if init == InitialCaches::Zero {
        caches.reset();
    }
    let plan = Plan {
        cfg,
        w,
        isa,
        opts: *opts,
        block,
        wk_len,
        workers: exec.workers().max(1),
    };
    run(
        &plan,
        x,
        n,
        &|i| cu_seqlens[i],
        caches,
        out,
        workspace,
        exec,
    )
}

/// One decode step (recurrent) on the calling thread. See [`decode_step_with`].
pub fn decode_step(
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    caches: CachesMut<'_>,
    out: &mut [f32],
    workspace: &mut [f32],
) -> Result<(), KdaError> {
    decode_step_with(cfg, w, x, caches, out, workspace, None, &Serial)
}

/// One decode step: one token for each of `N` sequences, each with its own caches
/// (`x`, `out`: `[N, hidden]`; caches hold `N` sequences and are updated in place). Always
/// recurrent; `isa` as in [`ForwardOptions`].
#[allow(clippy::too_many_arguments)]
pub fn decode_step_with(
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    caches: CachesMut<'_>,
    out: &mut [f32],
    workspace: &mut [f32],
    isa: Option<Isa>,
    exec: &dyn Executor,
) -> Result<(), KdaError> {
    w.validate(cfg)?;
    let opts = ForwardOptions {
        isa,
        ..ForwardOptions::recurrent()
    };
    let isa = opts.validate()?;
    let n = rows_of("x", x.len(), cfg.hidden)?;
    check_len("out", out.len(), x.len())?;
    caches.validate(cfg, n)?;
    let (block, wk_len) = block_tokens(cfg, workspace.len(), n, None, exec.workers())?;
    let plan = Plan {
        cfg,
        w,
        isa,
        opts,
        block,
        wk_len,
        workers: exec.workers().max(1),
    };
    run(&plan, x, n, &|i| i, caches, out, workspace, exec)
}

/// The block size and per-worker scratch a workspace of `ws` elements allows for `tokens`
/// tokens: the largest block whose projections get the packing scratch, grown with any room
/// left (a block beyond [`PROJECT_TOKENS`] tokens needs no more scratch per worker).
fn block_tokens(
    cfg: &KdaConfig,
    ws: usize,
    tokens: usize,
    chunk: Option<usize>,
    workers: usize,
) -> Result<(usize, usize), KdaError> {
    let per = per_token_workspace(cfg)?;
    let workers = workers.max(1);
    let need = |b: usize| -> Result<(usize, usize), KdaError> {
        let wk = per_worker(cfg, chunk, b)?;
        let fixed = mul("workspace", wk, workers)?;
        Ok((add("workspace", fixed, mul("workspace", per, b)?)?, wk))
    };
    let (needed, _) = need(1)?;
    if ws < needed {
        return Err(KdaError::TooSmall {
            arg: "workspace",
            needed,
            actual: ws,
        });
    }
    // `need` grows with `b`: binary search for the largest block in 1..=top that fits.
    let (mut lo, mut hi) = (1, tokens.clamp(1, PROJECT_TOKENS));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if need(mid)?.0 <= ws {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let wk = need(lo)?.1;
    let block = ((ws - wk * workers) / per).clamp(lo, tokens.max(1));
    Ok((block, wk))
}

/// Everything fixed for one call.
struct Plan<'p, 'w> {
    cfg: &'p KdaConfig,
    w: &'p KdaWeights<'w>,
    isa: Isa,
    opts: ForwardOptions,
    block: usize,
    /// f32 elements of scratch per worker.
    wk_len: usize,
    workers: usize,
}

/// How a projection's output element `(t, o)` is laid out.
#[derive(Clone, Copy)]
enum Layout {
    /// `[H, B, K]`: `(o / K)·B·K + t·K + o % K`.
    HeadMajor { k: usize, bt: usize },
    /// `[R, B]`: `o·B + t`.
    Transposed { bt: usize },
    /// `[B, ld]` at column offset `off`: `t·ld + off + o`.
    TokenMajor { ld: usize, off: usize },
}

impl Layout {
    #[inline]
    fn index(self, t: usize, o: usize) -> usize {
        match self {
            Layout::HeadMajor { k, bt } => (o / k) * bt * k + t * k + o % k,
            Layout::Transposed { bt } => o * bt + t,
            Layout::TokenMajor { ld, off } => t * ld + off + o,
        }
    }
}

/// What happens to a projected value before it is stored.
#[derive(Clone, Copy)]
enum Post {
    None,
    Decay,
    Sigmoid,
}

/// One projection: `out[layout(t, o)] = post(x[t, off..off+cols] · W[o])`.
struct Proj<'a, 'w> {
    w: MatRef<'w>,
    x: &'a [f32],
    x_ld: usize,
    x_off: usize,
    out: &'a Shared<'a>,
    layout: Layout,
    post: Post,
}

/// Output rows per projection task: 64 lets decode stream four 16-row panels at once
/// (panel-layout weights) and is a whole number of the kernels' 8-, 16- and 32-row groups.
const TILE: usize = 64;

/// Computes output rows `o0..o1` of `p` for the block's `bt` tokens, with `scratch` for the
/// projection kernel's accumulators.
#[allow(clippy::too_many_arguments)]
fn proj_tile(
    plan: &Plan<'_, '_>,
    p: &Proj<'_, '_>,
    bt: usize,
    o0: usize,
    o1: usize,
    scratch: &mut [f32],
    failed: &Failed,
) {
    let cols = p.w.cols();
    let row = |t: usize| &p.x[t * p.x_ld + p.x_off..t * p.x_ld + p.x_off + cols];
    let cfg = plan.cfg;
    // exp(A_log) of the head of the last row seen: rows arrive in order within a tile.
    let mut head_a: (usize, Option<f32>) = (usize::MAX, None);
    let mut post = |o: usize, v: f32| match p.post {
        Post::None => v,
        Post::Sigmoid => sigmoid(v),
        Post::Decay => {
            let h = o / cfg.head_dim;
            if head_a.0 != h {
                head_a = (h, plan.w.a_log.map(|a| crate::math::exp(a.at(h))));
            }
            decay_one(cfg.decay_gate, head_a.1, plan.w.dt_bias, o, v)
        }
    };
    let mut store = |t: usize, first: usize, vals: &[f32]| {
        // A run that lands contiguously (one head of a head-major buffer, or a token-major
        // row) is written as a slice; anything else element by element.
        let contiguous = match p.layout {
            Layout::HeadMajor { k, .. } => first % k + vals.len() <= k,
            Layout::TokenMajor { .. } => true,
            Layout::Transposed { .. } => vals.len() <= 1,
        };
        if contiguous {
            // SAFETY: tiles of different tasks cover different output rows, and every layout
            // maps distinct (t, o) to distinct indices; the range covers outputs
            // `first..first + len` of token `t`, which only this task writes.
            match unsafe { p.out.slice(p.layout.index(t, first), vals.len()) } {
                Some(dst) => {
                    for (j, (d, &v)) in dst.iter_mut().zip(vals).enumerate() {
                        *d = post(first + j, v);
                    }
                }
                None => failed.set(),
            }
            return;
        }
        for (j, &v) in vals.iter().enumerate() {
            let o = first + j;
            // SAFETY: as above, for one element.
            if !unsafe { p.out.write(p.layout.index(t, o), post(o, v)) } {
                failed.set();
            }
        }
    };
    if !project_tile(plan.isa, &row, bt, &p.w, o0, o1, scratch, &mut store) {
        failed.set();
    }
}

/// Runs all tiles of `projs` as one round of tasks.
fn run_projs(
    plan: &Plan<'_, '_>,
    projs: &[Proj<'_, '_>],
    bt: usize,
    workers: &Shared<'_>,
    wk_len: usize,
    exec: &dyn Executor,
    failed: &Failed,
) {
    let tiles = |p: &Proj<'_, '_>| p.w.rows().div_ceil(TILE);
    let total: usize = projs.iter().map(tiles).sum();
    exec.run(total, &|task, worker| {
        // SAFETY: the scratch of worker index `worker` is used by one task at a time
        // (Executor contract), and no other round runs concurrently.
        let Some(scratch) = (unsafe { workers.slice(worker * wk_len, wk_len) }) else {
            failed.set();
            return;
        };
        let mut t = task;
        for p in projs {
            let n = tiles(p);
            if t < n {
                let o0 = t * TILE;
                proj_tile(
                    plan,
                    p,
                    bt,
                    o0,
                    (o0 + TILE).min(p.w.rows()),
                    scratch,
                    failed,
                );
                return;
            }
            t -= n;
        }
    });
}

/// The layer after validation. `bound(i)` is the first token of sequence `i` (`bound(n)` = T).
#[allow(clippy::too_many_arguments)]
fn run<'w>(
    plan: &Plan<'_, 'w>,
    x: &[f32],
    n_seq: usize,
    bound: &(dyn Fn(usize) -> usize + Sync),
    caches: CachesMut<'_>,
    out: &mut [f32],
    workspace: &mut [f32],
    exec: &dyn Executor,
) -> Result<(), KdaError> {
    let cfg = plan.cfg;
    let (hd, d, h, k) = (cfg.hidden, cfg.proj_dim(), cfg.heads, cfg.head_dim);
    let (rf, rg) = ranks(cfg);
    let (sl, cl) = (cfg.state_len()?, cfg.conv_state_len()?);
    let block = plan.block;
    let wk_len = plan.wk_len;

    let (q_all, rest) = workspace.split_at_mut(block * d);
    let (k_all, rest) = rest.split_at_mut(block * d);
    let (v_all, rest) = rest.split_at_mut(block * d);
    let (g_all, rest) = rest.split_at_mut(block * d);
    let (gate_all, rest) = rest.split_at_mut(block * d);
    let (beta_all, rest) = rest.split_at_mut(block * h);
    let (low_all, rest) = rest.split_at_mut(block * (rf + rg));
    let workers = Shared::new(&mut rest[..wk_len * plan.workers]);
    let states = Shared::new(caches.recurrent);
    let conv_states = [
        Shared::new(caches.conv_q),
        Shared::new(caches.conv_k),
        Shared::new(caches.conv_v),
    ];
    let out_sh = Shared::new(out);
    let failed = Failed::default();

    let t_total = bound(n_seq);
    let chunk_of = |s: usize| {
        let len = bound(s + 1) - bound(s);
        plan.opts.chunks(len).then_some(plan.opts.chunk_size)
    };
    let mut seq = 0;
    let mut t0 = 0;
    while t0 < t_total {
        while seq < n_seq && bound(seq + 1) <= t0 {
            seq += 1;
        }
        // Block end, moved back onto the chunk grid of a chunked sequence it cuts.
        let mut t1 = t_total.min(t0 + block);
        if t1 < t_total {
            let mut s = seq;
            while s < n_seq && bound(s + 1) <= t1 {
                s += 1;
            }
            if s < n_seq && bound(s) < t1 {
                if let Some(c) = chunk_of(s) {
                    let aligned = bound(s) + (t1 - bound(s)) / c * c;
                    if aligned > t0 {
                        t1 = aligned;
                    }
                }
            }
        }
        let bt = t1 - t0;
        let xb = &x[t0 * hd..t1 * hd];
        let (q, kk, v) = (
            Shared::new(&mut q_all[..bt * d]),
            Shared::new(&mut k_all[..bt * d]),
            Shared::new(&mut v_all[..bt * d]),
        );
        let (g, beta) = (
            Shared::new(&mut g_all[..bt * d]),
            Shared::new(&mut beta_all[..bt * h]),
        );
        let gate = Shared::new(&mut gate_all[..bt * d]);
        let low_sh = Shared::new(&mut low_all[..bt * (rf + rg)]);

        // Round 1: projections from x.
        {
            let hm = Layout::HeadMajor { k, bt };
            let proj = |w: MatRef<'w>, out, layout, post| Proj {
                w,
                x: xb,
                x_ld: hd,
                x_off: 0,
                out,
                layout,
                post,
            };
            let low_l = |off| Layout::TokenMajor { ld: rf + rg, off };
            let decay = match plan.w.decay_proj {
                GateWeights::FullRank(m) => proj(m, &g, hm, Post::Decay),
                GateWeights::LowRank { down, .. } => proj(down, &low_sh, low_l(0), Post::None),
            };
            let ogate = match plan.w.output_gate {
                GateWeights::FullRank(m) => {
                    proj(m, &gate, Layout::TokenMajor { ld: d, off: 0 }, Post::None)
                }
                GateWeights::LowRank { down, .. } => proj(down, &low_sh, low_l(rf), Post::None),
            };
            let projs = [
                proj(plan.w.q_proj, &q, hm, Post::None),
                proj(plan.w.k_proj, &kk, hm, Post::None),
                proj(plan.w.v_proj, &v, hm, Post::None),
                decay,
                proj(
                    plan.w.b_proj,
                    &beta,
                    Layout::Transposed { bt },
                    Post::Sigmoid,
                ),
                ogate,
            ];
            run_projs(plan, &projs, bt, &workers, wk_len, exec, &failed);
        }
        // Round 1b: up-projections of the low-rank gates.
        if rf + rg > 0 {
            // SAFETY: round 1 has finished; nothing else refers to the bottleneck rows now.
            let low: &[f32] = match unsafe { low_sh.slice(0, bt * (rf + rg)) } {
                Some(s) => s,
                None => return Err(KdaError::Internal { what: "bottleneck" }),
            };
            let up = |w: MatRef<'w>, off, out, layout, post| Proj {
                w,
                x: low,
                x_ld: rf + rg,
                x_off: off,
                out,
                layout,
                post,
            };
            let mut projs = [None, None];
            if let GateWeights::LowRank { up: u, .. } = plan.w.decay_proj {
                projs[0] = Some(up(u, 0, &g, Layout::HeadMajor { k, bt }, Post::Decay));
            }
            if let GateWeights::LowRank { up: u, .. } = plan.w.output_gate {
                projs[1] = Some(up(
                    u,
                    rf,
                    &gate,
                    Layout::TokenMajor { ld: d, off: 0 },
                    Post::None,
                ));
            }
            match projs {
                [Some(a), Some(b)] => run_projs(plan, &[a, b], bt, &workers, wk_len, exec, &failed),
                [Some(a), None] | [None, Some(a)] => {
                    run_projs(plan, &[a], bt, &workers, wk_len, exec, &failed)
                }
                [None, None] => {}
            }
        }

        // Round 2: one task per (sequence, head).
        let mut n_segs = 0;
        while seq + n_segs < n_seq && bound(seq + n_segs) < t1 {
            n_segs += 1;
        }
        let first_seg = seq;
        exec.run(n_segs * h, &|task, worker| {
            let s = first_seg + task / h;
            let head = task % h;
            let a = bound(s).max(t0) - t0;
            let b = bound(s + 1).min(t1) - t0;
            if a >= b {
                return;
            }
            let len = b - a;
            let phase = (t0 + a - bound(s)) % plan.opts.chunk_size;
            let ok = seq_head_task(
                plan,
                &q,
                &kk,
                &v,
                &g,
                &beta,
                &gate,
                &states,
                &conv_states,
                &workers,
                s,
                head,
                a,
                len,
                bt,
                worker,
                wk_len,
                sl,
                cl,
                chunk_of(s),
                phase,
            );
            if !ok {
                failed.set();
            }
        });

        // Round 3: o_proj from the normed rows (held in the gate buffer).
        {
            // SAFETY: round 2 has finished; the gate rows are only read from here on.
            let normed: &[f32] = match unsafe { gate.slice(0, bt * d) } {
                Some(s) => s,
                None => {
                    return Err(KdaError::Internal {
                        what: "normed rows",
                    })
                }
            };
            // SAFETY: this block's output rows are disjoint from every other block's, and
            // within the round each tile writes its own output columns.
            let out_rows = Shared::new(match unsafe { out_sh.slice(t0 * hd, bt * hd) } {
                Some(s) => s,
                None => {
                    return Err(KdaError::Internal {
                        what: "output rows",
                    })
                }
            });
            let p = Proj {
                w: plan.w.o_proj,
                x: normed,
                x_ld: d,
                x_off: 0,
                out: &out_rows,
                layout: Layout::TokenMajor { ld: hd, off: 0 },
                post: Post::None,
            };
            run_projs(plan, &[p], bt, &workers, wk_len, exec, &failed);
        }
        if failed.get() {
            return Err(KdaError::Internal { what: "layer task" });
        }
        t0 = t1;
    }
    Ok(())
}

/// Conv → L2 norm → delta rule → gated norm for rows `a..a+len` of the block, sequence `s`,
/// head `head`. Returns false on an internal error.
#[allow(clippy::too_many_arguments)]
fn seq_head_task<'w>(
    plan: &Plan<'_, 'w>,
    q: &Shared<'_>,
    kk: &Shared<'_>,
    v: &Shared<'_>,
    g: &Shared<'_>,
    beta: &Shared<'_>,
    gate: &Shared<'_>,
    states: &Shared<'_>,
    conv_states: &[Shared<'_>; 3],
    workers: &Shared<'_>,
    s: usize,
    head: usize,
    a: usize,
    len: usize,
    bt: usize,
    worker: usize,
    wk_len: usize,
    sl: usize,
    cl: usize,
    chunk: Option<usize>,
    phase: usize,
) -> bool {
    let cfg = plan.cfg;
    let (k, w) = (cfg.head_dim, cfg.conv_width);
    let d = cfg.proj_dim();
    let rows = head * bt * k + a * k;
    let hist = w - 1;
    // SAFETY: each (sequence, head) task gets the rows of its own head and sequence in the
    // head-major buffers, its own head's slice of its sequence's caches, and the scratch of
    // its worker index, which no concurrently running task shares (Executor contract).
    let parts = unsafe {
        (
            q.slice(rows, len * k),
            kk.slice(rows, len * k),
            v.slice(rows, len * k),
            g.slice(rows, len * k),
            beta.slice(head * bt + a, len),
            states.slice(s * sl + head * k * k, k * k),
            conv_states[0].slice(s * cl + head * k * hist, k * hist),
            conv_states[1].slice(s * cl + head * k * hist, k * hist),
            conv_states[2].slice(s * cl + head * k * hist, k * hist),
            workers.slice(worker * wk_len, wk_len),
        )
    };
    let (
        Some(qh),
        Some(kh),
        Some(vh),
        Some(gh),
        Some(bh),
        Some(st),
        Some(cq),
        Some(ck),
        Some(cv),
        Some(scr),
    ) = parts
    else {
        return false;
    };
    let (conv_tmp, scr) = scr.split_at_mut(short_conv_prefill_scratch(w));
    let (rec_scr, chunk_scr) = scr.split_at_mut(recurrent_scratch_len(k, k));
    let cw = |data: Data<'w>| data.slice(head * k * w, k * w);
    let ok = short_conv_prefill(qh, k, cw(plan.w.q_conv), cq, conv_tmp).is_ok()
        && short_conv_prefill(kh, k, cw(plan.w.k_conv), ck, conv_tmp).is_ok()
        && short_conv_prefill(vh, k, cw(plan.w.v_conv), cv, conv_tmp).is_ok()
        && l2_norm(qh, k, cfg.l2_eps).is_ok()
        && l2_norm(kh, k, cfg.l2_eps).is_ok();
    if !ok {
        return false;
    }
    let scale = cfg.scale();
    let ok = match chunk {
        Some(c) => {
            let first = if phase == 0 { c } else { c - phase };
            chunked_head(plan.isa, qh, kh, vh, gh, bh, scale, st, c, first, chunk_scr).is_ok()
        }
        None => recurrent_head(plan.isa, qh, kh, vh, gh, bh, scale, st, rec_scr).is_ok(),
    };
    if !ok {
        return false;
    }
    for t in 0..len {
        // SAFETY: row `a + t` of this head's columns in the token-major gate buffer belongs to
        // this task alone.
        let Some(grow) = (unsafe { gate.slice((a + t) * d + head * k, k) }) else {
            return false;
        };
        gated_rms_norm_row_into_gate(&vh[t * k..(t + 1) * k], grow, plan.w.o_norm, cfg.rms_eps);
    }
    true
}
