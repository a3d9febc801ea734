//! What a call needs before it runs: workspace sizes, the named regions carved from the
//! workspace, the block size a workspace allows, and the blocks (aligned to the chunk grid).

use core::ops::Range;

use super::options::Precision;
use crate::config::KdaConfig;
use crate::error::{add, mul, KdaError};
use crate::ops::chunked::chunked_scratch_len;
use crate::ops::conv::short_conv_prefill_scratch;
use crate::ops::linear::{project_scratch_len, PROJECT_DIRECT_MAX, PROJECT_TOKENS};
use crate::ops::recurrent::recurrent_scratch_len;

/// Every region starts at a multiple of this many f32 (64 bytes: one cache line when the
/// workspace itself is 64-byte aligned).
pub(crate) const ALIGN: usize = 16;

/// Smallest projection scratch per worker (1.5 KB): enough for blocks the projections run
/// straight from the weight rows (decode).
const PROJECT_MIN: usize = 4 * 96;

/// The low-rank bottleneck widths of the decay gate and the output gate (0 for full rank).
pub(crate) fn ranks(cfg: &KdaConfig) -> (usize, usize) {
    (cfg.decay_proj.rank(), cfg.output_gate.rank())
}

/// f32 elements of scratch per worker. The projection rounds and the (sequence, head) round
/// never overlap, so the region serves both: the conv's `W−1`, the recurrence's and (when it may
/// run) the chunked kernel's scratch, or the projection scratch: [`PROJECT_MIN`] when a block
/// has at most [`PROJECT_DIRECT_MAX`] tokens (the projections read the weight rows directly),
/// else room to pack a tile's weight rows whole for blocks of `block` tokens.
pub(crate) fn per_worker(cfg: &KdaConfig, needs: Needs, block: usize) -> Result<usize, KdaError> {
    let k = cfg.head_dim;
    let rec = add(
        "workspace",
        recurrent_scratch_len(k, k),
        short_conv_prefill_scratch(cfg.conv_width),
    )?;
    let seq_head = match needs.chunk {
        None => rec,
        Some(c) => add("workspace", rec, chunked_scratch_len(c, k, k))?,
    };
    let seq_head = if needs.verify {
        add("workspace", seq_head, verify_scratch_len(cfg)?)?
    } else {
        seq_head
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

/// What a call needs beyond the block's intermediates: the (sequence, head) tasks' scratch,
/// and the bf16 mode's rounded activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Needs {
    /// The chunked kernel's scratch for this chunk size, when some sequence runs chunked.
    pub(crate) chunk: Option<usize>,
    /// Private copies of one head's caches (a speculative verify leaves the caches alone).
    pub(crate) verify: bool,
    /// bf16 pairs per token of the projections' rounded inputs ([`pairs_width`]; 0 in exact
    /// mode).
    pub(crate) pairs: usize,
}

impl Needs {
    /// The needs of a forward whose sequences may run chunked with `chunk`.
    pub(crate) fn chunked(chunk: Option<usize>) -> Self {
        Needs {
            chunk,
            ..Needs::default()
        }
    }

    /// The needs of a speculative verify (recurrent, with private cache copies).
    pub(crate) fn verify() -> Self {
        Needs {
            verify: true,
            ..Needs::default()
        }
    }

    /// These needs with room for the bf16 mode's rounded activations when `precision` asks
    /// for it.
    pub(crate) fn with_precision(self, cfg: &KdaConfig, precision: Precision) -> Self {
        let pairs = match precision {
            Precision::Exact => 0,
            Precision::Bf16 => pairs_width(cfg),
        };
        Needs { pairs, ..self }
    }
}

/// bf16 pairs per token that holds any projection round's inputs rounded to bf16: the
/// hidden rows (round 1), both low-rank bottlenecks side by side (round 1b), the normed rows
/// (round 3).
pub(crate) fn pairs_width(cfg: &KdaConfig) -> usize {
    let (rf, rg) = ranks(cfg);
    let d = cfg.heads.saturating_mul(cfg.head_dim);
    cfg.hidden
        .div_ceil(2)
        .max(rf.div_ceil(2) + rg.div_ceil(2))
        .max(d.div_ceil(2))
}

/// f32 elements a verify task needs for its copy of one head's recurrent state (`K·K`) and
/// three conv states (`K·(W−1)` each).
pub(crate) fn verify_scratch_len(cfg: &KdaConfig) -> Result<usize, KdaError> {
    let k = cfg.head_dim;
    let conv = mul("workspace", 3 * k, cfg.conv_width.saturating_sub(1))?;
    add("workspace", mul("workspace", k, k)?, conv)
}

/// The regions of the layer's workspace, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Region {
    /// `[H, B, K]` queries (head-major).
    Q,
    /// `[H, B, K]` keys.
    K,
    /// `[H, B, K]` values, then the delta rule's outputs in place.
    V,
    /// `[H, B, K]` log-decay gate.
    Decay,
    /// `[B, H·K]` output gate, then the normed rows `o_proj` reads.
    Gate,
    /// `[H, B]` beta.
    Beta,
    /// `[B, r_decay + r_gate]` low-rank bottlenecks.
    LowRank,
    /// `[B, pairs]` a projection round's inputs rounded to bf16 pairs (bf16 mode; else empty).
    Pairs,
    /// `[workers, worker_len]` per-worker scratch.
    Workers,
}

const REGIONS: [Region; 9] = [
    Region::Q,
    Region::K,
    Region::V,
    Region::Decay,
    Region::Gate,
    Region::Beta,
    Region::LowRank,
    Region::Pairs,
    Region::Workers,
];

/// Where each [`Region`] lies in the workspace for blocks of `block` tokens: in order, each
/// start rounded up to [`ALIGN`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkspaceLayout {
    ranges: [Range<usize>; 9],
}

impl WorkspaceLayout {
    /// The layout for blocks of `block` tokens, `pairs` bf16 pairs per token ([`Needs`]) and
    /// `workers` scratch regions of `worker_len`.
    pub(crate) fn new(
        cfg: &KdaConfig,
        (block, pairs): (usize, usize),
        worker_len: usize,
        workers: usize,
    ) -> Result<Self, KdaError> {
        let d = cfg.proj_dim_checked()?;
        let (rf, rg) = ranks(cfg);
        let len = |r: Region| -> Result<usize, KdaError> {
            match r {
                Region::Q | Region::K | Region::V | Region::Decay | Region::Gate => {
                    mul("workspace", block, d)
                }
                Region::Beta => mul("workspace", block, cfg.heads),
                Region::LowRank => mul("workspace", block, add("workspace", rf, rg)?),
                Region::Pairs => mul("workspace", block, pairs),
                Region::Workers => mul("workspace", worker_len, workers),
            }
        };
        let mut ranges: [Range<usize>; 9] = Default::default();
        let mut at = 0usize;
        for (slot, r) in ranges.iter_mut().zip(REGIONS) {
            let start = add("workspace", at, ALIGN - 1)? / ALIGN * ALIGN;
            let end = add("workspace", start, len(r)?)?;
            *slot = start..end;
            at = end;
        }
        Ok(WorkspaceLayout { ranges })
    }

    /// f32 elements the layout spans.
    pub(crate) fn total(&self) -> usize {
        self.ranges[8].end
    }

    /// Where region `r` lies.
    #[cfg(test)]
    pub(crate) fn range(&self, r: Region) -> Range<usize> {
        self.ranges[r as usize].clone()
    }

    /// Splits `ws` (at least [`Self::total`] long) into the regions, in [`Region`] order.
    pub(crate) fn carve<'a>(&self, ws: &'a mut [f32]) -> Result<[&'a mut [f32]; 9], KdaError> {
        if ws.len() < self.total() {
            return Err(KdaError::Internal {
                what: "workspace layout",
            });
        }
        let mut rest = ws;
        let mut at = 0;
        let mut parts: [&'a mut [f32]; 9] = Default::default();
        for (part, range) in parts.iter_mut().zip(&self.ranges) {
            let (_, tail) = rest.split_at_mut(range.start - at);
            let (this, tail) = tail.split_at_mut(range.len());
            *part = this;
            rest = tail;
            at = range.end;
        }
        Ok(parts)
    }
}

/// f32 elements of workspace for blocks of `block` tokens with `workers` workers.
pub(crate) fn workspace_for(
    cfg: &KdaConfig,
    needs: Needs,
    block: usize,
    workers: usize,
) -> Result<usize, KdaError> {
    let wk = per_worker(cfg, needs, block.max(1))?;
    Ok(WorkspaceLayout::new(cfg, (block.max(1), needs.pairs), wk, workers.max(1))?.total())
}

/// The block size a workspace allows and the scratch each worker gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockSize {
    /// Most tokens per block.
    pub(crate) tokens: usize,
    /// f32 elements of scratch per worker.
    pub(crate) worker_len: usize,
    /// Workers (each with its own scratch).
    pub(crate) workers: usize,
    /// bf16 pairs per token of the rounded activations (0 in exact mode).
    pub(crate) pairs: usize,
}

impl BlockSize {
    /// The largest block whose projections get the packing scratch (up to
    /// [`PROJECT_TOKENS`]), grown with any room left (a block beyond that needs no more
    /// scratch per worker), for `tokens` tokens in a workspace of `ws` elements. Blocks are
    /// whole multiples of `unit` tokens (a sequence length a block must not split; 1 for any).
    pub(crate) fn fit(
        cfg: &KdaConfig,
        ws: usize,
        tokens: usize,
        needs: Needs,
        workers: usize,
        unit: usize,
    ) -> Result<Self, KdaError> {
        let (workers, unit) = (workers.max(1), unit.max(1));
        let needed = workspace_for(cfg, needs, unit, workers)?;
        if ws < needed {
            return Err(KdaError::TooSmall {
                arg: "workspace",
                needed,
                actual: ws,
            });
        }
        // Searched in units: `m` units are `m · unit` tokens.
        let units = tokens.div_ceil(unit).max(1);
        let fits = |m: usize| -> Result<bool, KdaError> {
            Ok(workspace_for(cfg, needs, m * unit, workers)? <= ws)
        };
        let best = largest(1, (PROJECT_TOKENS / unit).clamp(1, units), fits)?;
        let worker_len = per_worker(cfg, needs, best * unit)?;
        let grown = largest(best, units, |m| {
            Ok(
                WorkspaceLayout::new(cfg, (m * unit, needs.pairs), worker_len, workers)?.total()
                    <= ws,
            )
        })?;
        Ok(BlockSize {
            tokens: grown * unit,
            worker_len,
            workers,
            pairs: needs.pairs,
        })
    }

    /// The layout of a block of `tokens` tokens with this scratch.
    pub(crate) fn layout(&self, cfg: &KdaConfig) -> Result<WorkspaceLayout, KdaError> {
        WorkspaceLayout::new(
            cfg,
            (self.tokens, self.pairs),
            self.worker_len,
            self.workers,
        )
    }
}

/// The largest `b` in `lo..=hi` with `fits(b)`, given `fits(lo)` and `fits` monotone.
fn largest(
    lo: usize,
    hi: usize,
    fits: impl Fn(usize) -> Result<bool, KdaError>,
) -> Result<usize, KdaError> {
    let (mut lo, mut hi) = (lo, hi.max(lo));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    Ok(lo)
}

/// Where the sequences of a call start: packed offsets (forward) or one token each (decode).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Sequences<'a> {
    /// `cu_seqlens` (`[N+1]`, validated).
    Offsets(&'a [usize]),
    /// `count` sequences of `len` tokens each (decode: 1; a speculative verify: the drafts).
    Fixed { count: usize, len: usize },
}

impl Sequences<'_> {
    /// Number of sequences.
    pub(crate) fn count(&self) -> usize {
        match *self {
            Sequences::Offsets(cu) => cu.len() - 1,
            Sequences::Fixed { count, .. } => count,
        }
    }

    /// First token of sequence `i` (`start(count())` = T).
    pub(crate) fn start(&self, i: usize) -> usize {
        match *self {
            Sequences::Offsets(cu) => cu[i],
            Sequences::Fixed { len, .. } => i * len,
        }
    }

    /// Tokens of sequence `i`.
    pub(crate) fn len(&self, i: usize) -> usize {
        self.start(i + 1) - self.start(i)
    }

    /// Total tokens.
    pub(crate) fn tokens(&self) -> usize {
        self.start(self.count())
    }
}

/// The chunk grid of sequence `s` around its row `t`: `(chunk size, first row of the grid at
/// or before t)`, or `None` when the sequence runs recurrent.
pub(crate) type Grid<'a> = dyn Fn(usize, usize) -> Option<(usize, usize)> + 'a;

/// One block of tokens: rows `t0..t1` of the call, touching sequences
/// `first_seq..first_seq + seqs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) t0: usize,
    pub(crate) t1: usize,
    pub(crate) first_seq: usize,
    pub(crate) seqs: usize,
}

impl Block {
    /// Tokens in the block.
    pub(crate) fn len(&self) -> usize {
        self.t1 - self.t0
    }
}

/// The blocks of a call, in order: at most `block` tokens each, with every block end that cuts
/// a chunked sequence moved back onto that sequence's chunk grid (when that leaves the block
/// non-empty), so block boundaries never split a chunk.
pub(crate) struct Blocks<'a> {
    seqs: Sequences<'a>,
    block: usize,
    grid: &'a Grid<'a>,
    t0: usize,
    seq: usize,
}

impl<'a> Blocks<'a> {
    /// Blocks of up to `block` tokens over `seqs`; `grid(s, t)` is the chunk grid of sequence
    /// `s` around its row `t` when it runs chunked.
    pub(crate) fn new(seqs: Sequences<'a>, block: usize, grid: &'a Grid<'a>) -> Self {
        Blocks {
            seqs,
            block: block.max(1),
            grid,
            t0: 0,
            seq: 0,
        }
    }

    /// The sequence containing token `t` at or after `from` (the first that ends past `t`).
    fn seq_at(&self, from: usize, t: usize) -> usize {
        let mut s = from;
        while s < self.seqs.count() && self.seqs.start(s + 1) <= t {
            s += 1;
        }
        s
    }

    /// `t1`, moved back onto the chunk grid of the chunked sequence it cuts, if any.
    fn aligned_end(&self, t0: usize, t1: usize) -> usize {
        if t1 >= self.seqs.tokens() {
            return t1;
        }
        let s = self.seq_at(self.seq, t1);
        let start = self.seqs.start(s);
        if s < self.seqs.count() && start < t1 {
            if let Some((c, origin)) = (self.grid)(s, t1 - start) {
                let origin = start + origin;
                let aligned = origin + (t1 - origin) / c * c;
                if aligned > t0 {
                    return aligned;
                }
            }
        }
        t1
    }
}

impl Iterator for Blocks<'_> {
    type Item = Block;

    fn next(&mut self) -> Option<Block> {
        let total = self.seqs.tokens();
        if self.t0 >= total {
            return None;
        }
        let t0 = self.t0;
        self.seq = self.seq_at(self.seq, t0);
        let t1 = self.aligned_end(t0, total.min(t0 + self.block));
        let mut seqs = 0;
        while self.seq + seqs < self.seqs.count() && self.seqs.start(self.seq + seqs) < t1 {
            seqs += 1;
        }
        self.t0 = t1;
        Some(Block {
            t0,
            t1,
            first_seq: self.seq,
            seqs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    #[test]
    fn regions_are_aligned_disjoint_and_in_bounds() {
        for cfg in [
            KdaConfig::kimi_linear(40, 3, 16),
            KdaConfig::kimi_k3(7168, 96, 128),
        ] {
            for (block, wk, workers) in [(1, 100, 1), (37, 5000, 3), (256, 9, 2)] {
                let l = WorkspaceLayout::new(&cfg, (block, 3), wk, workers).unwrap();
                let mut prev_end = 0;
                for r in REGIONS {
                    let range = l.range(r);
                    assert_eq!(range.start % ALIGN, 0, "{r:?} aligned");
                    assert!(range.start >= prev_end, "{r:?} after the previous region");
                    prev_end = range.end;
                }
                assert_eq!(l.total(), prev_end);
                assert_eq!(l.range(Region::Workers).len(), wk * workers);
                assert_eq!(l.range(Region::Beta).len(), block * cfg.heads);
                let mut ws = std::vec![0.0f32; l.total()];
                let parts = l.carve(&mut ws).unwrap();
                for (p, r) in parts.iter().zip(REGIONS) {
                    assert_eq!(p.len(), l.range(r).len());
                }
                let mut short = std::vec![0.0f32; l.total() - 1];
                assert!(l.carve(&mut short).is_err());
            }
        }
    }

    #[test]
    fn block_size_is_the_largest_that_fits() {
        let cfg = KdaConfig::kimi_linear(40, 3, 16);
        for tokens in [1usize, 5, 300, 2000] {
            for chunk in [None, Some(16)] {
                let needs = Needs::chunked(chunk);
                let min = workspace_for(&cfg, needs, 1, 2).unwrap();
                assert!(BlockSize::fit(&cfg, min - 1, tokens, needs, 2, 1).is_err());
                for ws in [
                    min,
                    min + 1000,
                    workspace_for(&cfg, needs, tokens, 2).unwrap(),
                ] {
                    let b = BlockSize::fit(&cfg, ws, tokens, needs, 2, 1).unwrap();
                    assert!(b.tokens >= 1 && b.tokens <= tokens.max(1));
                    assert!(b.layout(&cfg).unwrap().total() <= ws);
                    if b.tokens < tokens {
                        let bigger = WorkspaceLayout::new(&cfg, (b.tokens + 1, 0), b.worker_len, 2);
                        assert!(
                            bigger.unwrap().total() > ws,
                            "T{tokens} ws{ws}: not largest"
                        );
                    }
                }
            }
        }
    }

    fn blocks(cu: &[usize], block: usize, chunk: Option<usize>) -> Vec<Block> {
        let f = move |_s: usize, _t: usize| chunk.map(|c| (c, 0));
        Blocks::new(Sequences::Offsets(cu), block, &f).collect()
    }

    #[test]
    fn blocks_cover_every_token_once_and_respect_the_chunk_grid() {
        let cu = [0usize, 5, 5, 40, 41, 100];
        for block in [1usize, 3, 16, 17, 50, 1000] {
            for chunk in [None, Some(4), Some(16)] {
                let bs = blocks(&cu, block, chunk);
                let mut t = 0;
                for b in &bs {
                    assert_eq!(b.t0, t);
                    assert!(b.len() >= 1 && b.len() <= block);
                    t = b.t1;
                    // Every sequence overlapping the block is listed, in order.
                    for s in b.first_seq..b.first_seq + b.seqs {
                        assert!(cu[s] < b.t1 && cu[s + 1] > b.t0 || cu[s] == cu[s + 1]);
                    }
                    // A cut inside a chunked sequence falls on its grid, unless the grid
                    // point before it would empty the block.
                    let cut = (0..5).find(|&s| cu[s] < b.t1 && b.t1 < cu[s + 1]);
                    if let (Some(c), Some(s)) = (chunk, cut) {
                        let grid = cu[s] + (b.t1 - cu[s]) / c * c;
                        assert!(grid == b.t1 || grid <= b.t0, "{b:?} C{c}");
                    }
                }
                assert_eq!(t, 100);
            }
        }
    }

    #[test]
    fn decode_blocks_list_their_sequences() {
        let none = |_s: usize, _t: usize| None;
        let bs: Vec<Block> = Blocks::new(Sequences::Fixed { count: 5, len: 1 }, 2, &none).collect();
        let seqs: Vec<(usize, usize)> = bs.iter().map(|b| (b.first_seq, b.seqs)).collect();
        assert_eq!(seqs, [(0, 2), (2, 2), (4, 1)]);
    }
}
