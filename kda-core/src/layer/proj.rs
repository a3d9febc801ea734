//! The projection rounds of a block: every projection from `x` (round 1), the low-rank gates'
//! up-projections (round 1b) and `o_proj` (round 3), each split into tiles of output rows that
//! run as independent tasks.

use crate::error::KdaError;
use crate::exec::{Executor, FirstError, Shared};
use crate::math::exp;
use crate::ops::gate::decay_run;
use crate::ops::linear::{project_tile, project_tile_pairs, Tile, TileRows};
use crate::weights::{GateWeights, MatRef};

use super::options::Precision;
use super::validated::KdaLayer;

/// Most projections in one round (round 1: q, k, v, decay, beta, output gate).
const MAX_PROJS: usize = 6;

/// A projection's input rows rounded to bf16 pairs (bf16 mode): row `t` is
/// `data[t·ld + off..][..cols.div_ceil(2)]`.
#[derive(Clone, Copy)]
struct PairsIn<'a> {
    data: &'a [u32],
    ld: usize,
    off: usize,
}

/// How a projection's output element `(t, o)` is laid out.
#[derive(Clone, Copy)]
pub(super) enum Layout {
    /// `[H, B, K]`: `(o / K)·B·K + t·K + o % K`.
    HeadMajor { head_dim: usize, tokens: usize },
    /// `[R, B]`: `o·B + t`.
    Transposed { tokens: usize },
    /// `[B, ld]` at column offset `off`: `t·ld + off + o`.
    TokenMajor { ld: usize, off: usize },
}

impl Layout {
    #[inline]
    fn index(self, t: usize, o: usize) -> usize {
        match self {
            Layout::HeadMajor {
                head_dim: k,
                tokens,
            } => (o / k) * tokens * k + t * k + o % k,
            Layout::Transposed { tokens } => o * tokens + t,
            Layout::TokenMajor { ld, off } => t * ld + off + o,
        }
    }

    /// Whether outputs `first..first + len` of one token are contiguous in this layout.
    #[inline]
    fn contiguous(self, first: usize, len: usize) -> bool {
        match self {
            Layout::HeadMajor { head_dim: k, .. } => first % k + len <= k,
            Layout::TokenMajor { .. } => true,
            Layout::Transposed { .. } => len <= 1,
        }
    }
}

/// What happens to a projected value before it is stored.
#[derive(Clone, Copy)]
pub(super) enum Post {
    None,
    Decay,
    Sigmoid,
}

/// One projection: `out[layout(t, o)] = post(x[t, off..off+cols] · W[o])`.
pub(super) struct Proj<'a, 'w> {
    pub(super) w: MatRef<'w>,
    /// Input rows `[B, x_ld]`, read from column `x_off`.
    pub(super) x: &'a [f32],
    pub(super) x_ld: usize,
    pub(super) x_off: usize,
    pub(super) out: &'a Shared<'a>,
    pub(super) layout: Layout,
    pub(super) post: Post,
}

/// The shared state of one projection round: the layer, the block's token count and the
/// workers' scratch.
pub(super) struct Round<'r, 'w> {
    pub(super) layer: &'r KdaLayer<'w>,
    pub(super) tokens: usize,
    pub(super) scratch: &'r Shared<'r>,
    pub(super) worker_len: usize,
}

impl Round<'_, '_> {
    /// Runs every tile of `projs` as one round of tasks on `exec`; in bf16 mode their inputs
    /// are first rounded into `pairs`.
    fn run(
        &self,
        projs: &[Proj<'_, '_>],
        pairs: &mut [u32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let rounded = match self.layer.opts.precision {
            Precision::Exact => [None; MAX_PROJS],
            Precision::Bf16 => self.round_inputs(projs, pairs)?,
        };
        let tile = crate::ops::linear::project_tile_rows(self.tokens);
        let tiles = |p: &Proj<'_, '_>| p.w.rows().div_ceil(tile);
        let total: usize = projs.iter().map(tiles).sum();
        let first_error = FirstError::default();
        exec.run(total, &|task, worker| {
            let mut t = task;
            for (p, pin) in projs.iter().zip(rounded) {
                let n = tiles(p);
                if t < n {
                    let rows = t * tile..((t + 1) * tile).min(p.w.rows());
                    first_error.record(self.tile(p, pin, rows, worker));
                    return;
                }
                t -= n;
            }
        });
        first_error.take()
    }

    /// Rounds the distinct input rows of `projs` (projections reading the same columns share
    /// them) to bf16 pairs, side by side in rows of `pairs`; one view per projection.
    fn round_inputs<'p>(
        &self,
        projs: &[Proj<'_, '_>],
        pairs: &'p mut [u32],
    ) -> Result<[Option<PairsIn<'p>>; MAX_PROJS], KdaError> {
        let key = |p: &Proj<'_, '_>| (p.x.as_ptr(), p.x_off, p.w.cols());
        // Each projection's column offset in the rows of `pairs`, and whether it is the first
        // to read its inputs (the one that rounds them).
        let (mut offs, mut first) = ([0usize; MAX_PROJS], [false; MAX_PROJS]);
        let mut ld = 0;
        for (i, p) in projs.iter().enumerate().take(MAX_PROJS) {
            match projs[..i].iter().position(|q| key(q) == key(p)) {
                Some(j) => offs[i] = offs[j],
                None => {
                    (offs[i], first[i]) = (ld, true);
                    ld += p.w.cols().div_ceil(2);
                }
            }
        }
        if projs.len() > MAX_PROJS || pairs.len() < self.tokens * ld {
            return Err(KdaError::Internal {
                what: "bf16 pairs region",
            });
        }
        let isa = self.layer.isa;
        for (i, p) in projs.iter().enumerate().filter(|&(i, _)| first[i]) {
            let (cols, width) = (p.w.cols(), p.w.cols().div_ceil(2));
            for t in 0..self.tokens {
                let x = &p.x[t * p.x_ld + p.x_off..t * p.x_ld + p.x_off + cols];
                let out = &mut pairs[t * ld + offs[i]..t * ld + offs[i] + width];
                crate::simd::round_pairs_row(isa, x, out)?;
            }
        }
        let data: &'p [u32] = pairs;
        let mut views = [None; MAX_PROJS];
        for (v, &off) in views.iter_mut().zip(&offs).take(projs.len()) {
            *v = Some(PairsIn { data, ld, off });
        }
        Ok(views)
    }

    /// Output rows `rows` of `p` for the block's tokens (from `pin`, its inputs rounded to
    /// bf16 pairs, in bf16 mode), on worker `worker`'s scratch.
    fn tile(
        &self,
        p: &Proj<'_, '_>,
        pin: Option<PairsIn<'_>>,
        rows: core::ops::Range<usize>,
        worker: usize,
    ) -> Result<(), KdaError> {
        // SAFETY: the scratch of worker index `worker` is used by one task at a time
        // (Executor contract), and no other round runs concurrently.
        let scratch = unsafe {
            self.scratch.slice(
                "projection scratch",
                worker * self.worker_len,
                self.worker_len,
            )?
        };
        let cols = p.w.cols();
        let row = |t: usize| &p.x[t * p.x_ld + p.x_off..t * p.x_ld + p.x_off + cols];
        let mut post = PostOp::new(self.layer, p.post);
        let mut store = |t: usize, first: usize, vals: &[f32]| store(p, &mut post, t, first, vals);
        let isa = self.layer.isa;
        let tile = Tile {
            w: &p.w,
            o0: rows.start,
            o1: rows.end,
        };
        if let Some(pi) = pin {
            let width = cols.div_ceil(2);
            let row = |t: usize| &pi.data[t * pi.ld + pi.off..t * pi.ld + pi.off + width];
            let x = TileRows {
                row: &row,
                tokens: self.tokens,
            };
            return project_tile_pairs(isa, x, tile, scratch, &mut store);
        }
        let x = TileRows {
            row: &row,
            tokens: self.tokens,
        };
        project_tile(isa, x, tile, scratch, &mut store)
    }
}

/// The post-processing of one tile, with `exp(A_log)` cached for the head of the last row
/// seen (rows arrive in order within a tile).
struct PostOp<'l, 'w> {
    layer: &'l KdaLayer<'w>,
    post: Post,
    head_a: (usize, Option<f32>),
}

impl<'l, 'w> PostOp<'l, 'w> {
    fn new(layer: &'l KdaLayer<'w>, post: Post) -> Self {
        PostOp {
            layer,
            post,
            head_a: (usize::MAX, None),
        }
    }

    /// `dst[j] = post(first + j, vals[j])`, a head at a time, the gate functions on the
    /// layer's vector path (`simd::sigmoid_scaled` / `softplus_scaled`; on the portable path
    /// the `libm` numbers of `ops::gate::decay_gate` and `math::sigmoid`).
    fn apply_slice(&mut self, first: usize, vals: &[f32], dst: &mut [f32]) {
        let isa = self.layer.isa;
        dst.copy_from_slice(vals);
        match self.post {
            Post::None => {}
            Post::Sigmoid => crate::simd::sigmoid_scaled(isa, dst, 1.0),
            Post::Decay => {
                let (cfg, w) = (&self.layer.cfg, &self.layer.weights);
                let k = cfg.head_dim;
                let mut j = 0;
                while j < dst.len() {
                    let o = first + j;
                    let (h, n) = (o / k, (k - o % k).min(dst.len() - j));
                    if self.head_a.0 != h {
                        self.head_a = (h, w.a_log.map(|a| exp(a.at(h))));
                    }
                    let run = &mut dst[j..j + n];
                    decay_run(isa, cfg.decay_gate, (self.head_a.1, w.dt_bias), o, run);
                    j += n;
                }
            }
        }
    }
}

/// Outputs per post-op pass of a non-contiguous store.
const POST_CHUNK: usize = 64;

/// Stores outputs `first..first + vals.len()` of token `t`: as a slice where they land
/// contiguously (one head of a head-major buffer, or a token-major row), else one by one.
#[inline(always)]
fn store(
    p: &Proj<'_, '_>,
    post: &mut PostOp<'_, '_>,
    t: usize,
    first: usize,
    vals: &[f32],
) -> Result<(), KdaError> {
    if let ([v], Post::None) = (vals, post.post) {
        // One output and nothing to apply (kernels that store one output at a time, e.g.
        // int8 weights): straight to its place.
        // SAFETY: tiles of different tasks cover different output rows, and every layout
        // maps distinct (t, o) to distinct indices; only this task writes output `first` of
        // token `t`.
        unsafe {
            p.out
                .write("projection output", p.layout.index(t, first), *v)?
        };
        return Ok(());
    }
    if p.layout.contiguous(first, vals.len()) {
        // SAFETY: tiles of different tasks cover different output rows, and every layout
        // maps distinct (t, o) to distinct indices; the range covers outputs
        // `first..first + len` of token `t`, which only this task writes.
        let dst = unsafe {
            p.out
                .slice("projection output", p.layout.index(t, first), vals.len())?
        };
        post.apply_slice(first, vals, dst);
        return Ok(());
    }
    // Through a stack buffer, so that every element gets the same (vector) post-op as the
    // contiguous case: the result must not depend on how outputs are grouped.
    let mut buf = [0.0f32; POST_CHUNK];
    for (c, chunk) in vals.chunks(POST_CHUNK).enumerate() {
        let f = first + c * POST_CHUNK;
        let out = &mut buf[..chunk.len()];
        post.apply_slice(f, chunk, out);
        for (j, &v) in out.iter().enumerate() {
            // SAFETY: as above, for one element.
            unsafe {
                p.out
                    .write("projection output", p.layout.index(t, f + j), v)?
            };
        }
    }
    Ok(())
}

/// The block's intermediates, shared by the tasks of every round: each task writes or reads
/// only its own rows or columns.
pub(super) struct BlockViews<'a> {
    pub(super) q: &'a Shared<'a>,
    pub(super) k: &'a Shared<'a>,
    pub(super) v: &'a Shared<'a>,
    pub(super) decay: &'a Shared<'a>,
    pub(super) beta: &'a Shared<'a>,
    pub(super) gate: &'a Shared<'a>,
    pub(super) low_rank: &'a Shared<'a>,
}

impl<'r, 'w> Round<'r, 'w> {
    /// Round 1: every projection from the block's input rows `x` (`[B, hidden]`).
    pub(super) fn input_projections(
        &self,
        x: &[f32],
        out: &BlockViews<'_>,
        pairs: &mut [u32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let (cfg, w) = (&self.layer.cfg, &self.layer.weights);
        let (d, b) = (cfg.proj_dim(), self.tokens);
        let (rf, rg) = super::plan::ranks(cfg);
        let head_major = Layout::HeadMajor {
            head_dim: cfg.head_dim,
            tokens: b,
        };
        let proj = |w, out, layout, post| Proj {
            w,
            x,
            x_ld: cfg.hidden,
            x_off: 0,
            out,
            layout,
            post,
        };
        let low = |off| Layout::TokenMajor { ld: rf + rg, off };
        let decay = match w.decay_proj {
            GateWeights::FullRank(m) => proj(m, out.decay, head_major, Post::Decay),
            GateWeights::LowRank { down, .. } => proj(down, out.low_rank, low(0), Post::None),
        };
        let gate = match w.output_gate {
            GateWeights::FullRank(m) => proj(
                m,
                out.gate,
                Layout::TokenMajor { ld: d, off: 0 },
                Post::None,
            ),
            GateWeights::LowRank { down, .. } => proj(down, out.low_rank, low(rf), Post::None),
        };
        let beta = Layout::Transposed { tokens: b };
        let projs = [
            proj(w.q_proj, out.q, head_major, Post::None),
            proj(w.k_proj, out.k, head_major, Post::None),
            proj(w.v_proj, out.v, head_major, Post::None),
            decay,
            proj(w.b_proj, out.beta, beta, Post::Sigmoid),
            gate,
        ];
        self.run(&projs, pairs, exec)
    }

    /// Round 1b: the up-projections of the low-rank gates from the bottleneck rows `low`
    /// (`[B, r_decay + r_gate]`).
    pub(super) fn low_rank_up(
        &self,
        low: &[f32],
        out: &BlockViews<'_>,
        pairs: &mut [u32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let (cfg, w) = (&self.layer.cfg, &self.layer.weights);
        let (rf, rg) = super::plan::ranks(cfg);
        let up = |w, off, out, layout, post| Proj {
            w,
            x: low,
            x_ld: rf + rg,
            x_off: off,
            out,
            layout,
            post,
        };
        let head_major = Layout::HeadMajor {
            head_dim: cfg.head_dim,
            tokens: self.tokens,
        };
        let token_major = Layout::TokenMajor {
            ld: cfg.proj_dim(),
            off: 0,
        };
        let mut projs = [None, None];
        if let GateWeights::LowRank { up: u, .. } = w.decay_proj {
            projs[0] = Some(up(u, 0, out.decay, head_major, Post::Decay));
        }
        if let GateWeights::LowRank { up: u, .. } = w.output_gate {
            projs[1] = Some(up(u, rf, out.gate, token_major, Post::None));
        }
        match projs {
            [Some(a), Some(b)] => self.run(&[a, b], pairs, exec),
            [Some(a), None] | [None, Some(a)] => self.run(&[a], pairs, exec),
            [None, None] => Ok(()),
        }
    }

    /// Round 3: `o_proj` from the normed rows `normed` (`[B, H·K]`) into `out` (`[B, hidden]`).
    pub(super) fn output(
        &self,
        normed: &[f32],
        out: &Shared<'_>,
        pairs: &mut [u32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let cfg = &self.layer.cfg;
        let p = Proj {
            w: self.layer.weights.o_proj,
            x: normed,
            x_ld: cfg.proj_dim(),
            x_off: 0,
            out,
            layout: Layout::TokenMajor {
                ld: cfg.hidden,
                off: 0,
            },
            post: Post::None,
        };
        self.run(&[p], pairs, exec)
    }
}
