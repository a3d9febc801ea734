//! The whole layer: a validated [`KdaLayer`] runs sequence forwards (prefill) and decode steps
//! over caller buffers whose sizes its sizing methods give.
//!
//! Per token, in order (spec §9.2):
//! projections → short convs (+SiLU) → decay gate, beta → q/k L2 norm → delta rule
//! (token-by-token recurrence or chunked) → gated RMSNorm → `o_proj`.
//!
//! **Plan once.** [`KdaLayer::new`] checks the config, every weight's shape and form, the
//! options and the instruction set once; per call only the lengths of the call's slices are
//! checked.
//!
//! **Blocks.** Tokens are processed in blocks; the workspace holds one block's intermediates
//! (and each worker's scratch), and the caller picks the block size by the workspace it passes
//! ([`KdaLayer::workspace_len`]). The caches carry everything from one block to the next. In
//! recurrent mode the result does not depend on the block size at all (bitwise); in chunked
//! mode block ends are moved onto the sequence's chunk grid, so any block of at least
//! `chunk_size` tokens gives bitwise the same result too.
//!
//! **Tasks.** Each block runs as three rounds of independent tasks on an [`Executor`]:
//! projection tiles (`proj.rs`), one task per (sequence, head) for conv → norm → delta rule →
//! gated norm (`task.rs`), then `o_proj` tiles. Results are bitwise identical for any number
//! of threads. Intermediates are head-major (`[H, B, K]`) so each (sequence, head) task owns
//! contiguous rows. The workspace regions and the block iterator are in `plan.rs`.
//!
//! **Failure policy.** Everything a caller can get wrong is checked before anything is
//! written: in [`KdaLayer::new`] (config, weights, options) and at the start of each call
//! (slice lengths, offsets, caches). Inside, functions return `Result<_, KdaError>` and pass
//! errors on with `?`; what can fail there are only the bounds checks that keep the shared
//! buffers' unsafe access sound, which the plan makes unreachable — they surface as
//! [`KdaError::Internal`] naming the region (a bug to report), never as a panic.

mod options;
mod plan;
mod proj;
mod snapshot;
mod speculative;
mod task;
mod validated;
mod views;

pub use options::{
    ForwardOptions, InitialCaches, Mode, Precision, AUTO_CHUNK_MIN_TOKENS, DEFAULT_CHUNK,
};
pub use snapshot::{snapshot_count, snapshot_positions, SnapshotPos, Snapshots};
pub use speculative::{commit_workspace_len, rollback_len, Rollback};
pub use validated::KdaLayer;

use speculative::{CommitViews, RecordLayout, VerifyViews};

use crate::cache::CachesMut;
use crate::config::KdaConfig;
use crate::error::{check_len, rows_of, KdaError};
use crate::exec::{Executor, FirstError, Shared};

use plan::{Block, BlockSize, Blocks, Needs, Sequences};
use proj::{BlockViews, Round};
use task::HeadBuffers;
use views::{CacheViews, SeqHead, SnapViews};

/// f32 elements of workspace for a forward with `opts`, processing up to `block_tokens` tokens
/// at a time on an executor with `workers` workers. (Any `block_tokens ≥ 1` gives a correct
/// result; larger blocks reuse each weight row more.) With [`Mode::Auto`], chunk scratch is
/// included only when `block_tokens` reaches [`AUTO_CHUNK_MIN_TOKENS`]: pass the longest
/// sequence length (or more) as `block_tokens` if the block may be smaller than a sequence.
///
/// Needs no weights, so static buffers can be sized before a layer exists;
/// [`KdaLayer::workspace_len`] gives the same figure.
pub fn workspace_len(
    cfg: &KdaConfig,
    opts: &ForwardOptions,
    block_tokens: usize,
    workers: usize,
) -> Result<usize, KdaError> {
    cfg.validate()?;
    opts.validate()?;
    let needs = Needs::chunked(opts.chunk_for(block_tokens)).with_precision(cfg, opts.precision);
    plan::workspace_for(cfg, needs, block_tokens, workers)
}

/// Workspace for a forward (default options, one worker) with blocks of up to `block_tokens`
/// tokens.
pub fn forward_workspace_len(cfg: &KdaConfig, block_tokens: usize) -> Result<usize, KdaError> {
    workspace_len(cfg, &ForwardOptions::default(), block_tokens, 1)
}

/// Workspace for a decode step over `batch` sequences in one block, one worker (a smaller
/// workspace, down to one sequence's worth, also works, in more blocks).
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

/// The tokens of one forward call: `N` packed sequences and where their outputs go.
#[derive(Debug)]
pub struct Batch<'a> {
    /// `[T, hidden]` input rows.
    pub x: &'a [f32],
    /// `[N+1]` offsets: sequence `n` is rows `cu_seqlens[n]..cu_seqlens[n+1]` (may be empty).
    pub cu_seqlens: &'a [usize],
    /// `[T, hidden]` output rows.
    pub out: &'a mut [f32],
}

impl<'w> KdaLayer<'w> {
    /// `base` with the room the layer's precision needs.
    fn needs(&self, base: Needs) -> Needs {
        base.with_precision(&self.cfg, self.opts.precision)
    }

    /// f32 elements of workspace for [`Self::forward`] with blocks of up to `block_tokens`
    /// tokens on `workers` workers (see [`workspace_len`]).
    pub fn workspace_len(&self, block_tokens: usize, workers: usize) -> Result<usize, KdaError> {
        let chunk = self.opts.chunk_for(block_tokens);
        plan::workspace_for(
            &self.cfg,
            self.needs(Needs::chunked(chunk)),
            block_tokens,
            workers,
        )
    }

    /// f32 elements of workspace for a [`Self::decode_step`] over `batch` sequences in one
    /// block on `workers` workers.
    pub fn decode_workspace_len(&self, batch: usize, workers: usize) -> Result<usize, KdaError> {
        plan::workspace_for(&self.cfg, self.needs(Needs::default()), batch, workers)
    }

    /// Runs the layer over the `N` packed sequences of `batch`.
    ///
    /// * `caches`: the `N` sequences' caches, read as initial caches when `init` is
    ///   [`InitialCaches::Given`] and always left holding the final caches.
    /// * `workspace`: at least [`Self::workspace_len`]`(1, exec.workers())` elements (with
    ///   `block_tokens` covering the longest sequence in [`Mode::Auto`]); the block size is
    ///   whatever fits.
    ///
    /// Every length and offset is checked before anything is written. NaN or ±∞ in the
    /// inputs, weights or caches propagate to the outputs of their token and the tokens after
    /// it; they never cause a panic.
    pub fn forward(
        &self,
        batch: Batch<'_>,
        caches: CachesMut<'_>,
        init: InitialCaches,
        workspace: &mut [f32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        self.forward_inner(batch, None, caches, init, workspace, exec)
    }

    /// [`Self::forward`] that also writes the caches of each sequence after the tokens listed
    /// in `snapshots` (see [`Snapshots`], [`snapshot_positions`]). Each snapshot is bitwise
    /// the final caches of a run over exactly that prefix; the chunked grid restarts at each
    /// snapshot position, so with positions on the chunk grid (multiples of the chunk size)
    /// the outputs and final caches are bitwise those of [`Self::forward`].
    pub fn forward_with_snapshots(
        &self,
        batch: Batch<'_>,
        snapshots: Snapshots<'_>,
        caches: CachesMut<'_>,
        init: InitialCaches,
        workspace: &mut [f32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        self.forward_inner(batch, Some(snapshots), caches, init, workspace, exec)
    }

    fn forward_inner(
        &self,
        batch: Batch<'_>,
        snapshots: Option<Snapshots<'_>>,
        mut caches: CachesMut<'_>,
        init: InitialCaches,
        workspace: &mut [f32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let Batch { x, cu_seqlens, out } = batch;
        let tokens = self.rows(x, out)?;
        let n = validate_offsets(cu_seqlens, tokens)?;
        caches.validate(&self.cfg, n)?;
        let seqs = Sequences::Offsets(cu_seqlens);
        if let Some(s) = &snapshots {
            snapshot::validate(&self.cfg, s, n, |i| seqs.len(i))?;
        }
        let longest = (0..n).map(|s| seqs.len(s)).max().unwrap_or(0);
        let chunk = self.opts.chunk_for(longest);
        let needs = self.needs(Needs::chunked(chunk));
        let size = BlockSize::fit(&self.cfg, workspace.len(), tokens, needs, exec.workers(), 1)?;
        if init == InitialCaches::Zero {
            caches.reset();
        }
        let snaps = snapshots.map(SnapViews::new);
        let call = Call {
            x,
            seqs,
            size,
            snaps: snaps.as_ref(),
            verify: None,
        };
        self.run(call, caches, out, workspace, exec)
    }

    /// One decode step: one token for each of `N` sequences, each with its own caches
    /// (`x`, `out`: `[N, hidden]`; caches hold `N` sequences and are updated in place). Always
    /// recurrent. `workspace`: at least [`Self::decode_workspace_len`]`(1, exec.workers())`.
    pub fn decode_step(
        &self,
        x: &[f32],
        out: &mut [f32],
        caches: CachesMut<'_>,
        workspace: &mut [f32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let n = self.rows(x, out)?;
        caches.validate(&self.cfg, n)?;
        let needs = self.needs(Needs::default());
        let size = BlockSize::fit(&self.cfg, workspace.len(), n, needs, exec.workers(), 1)?;
        let layer = self.with_mode(Mode::Recurrent);
        let seqs = Sequences::Fixed { count: n, len: 1 };
        let call = Call {
            x,
            seqs,
            size,
            snaps: None,
            verify: None,
        };
        layer.run(call, caches, out, workspace, exec)
    }

    /// f32 elements of workspace for a [`Self::verify`] of `drafts` tokens for `batch`
    /// sequences in one block on `workers` workers (down to one sequence's worth also works).
    pub fn verify_workspace_len(
        &self,
        batch: usize,
        drafts: usize,
        workers: usize,
    ) -> Result<usize, KdaError> {
        let needs = self.needs(Needs::verify());
        let tokens = crate::error::mul("workspace", batch.max(1), drafts.max(1))?;
        plan::workspace_for(&self.cfg, needs, tokens, workers)
    }

    /// A speculative verify: runs the `D = rollback.drafts` draft tokens of each of `N`
    /// sequences (`x`, `out`: `[N·D, hidden]`, sequence by sequence) from its caches,
    /// recurrent, and fills `rollback` ([`rollback_len`]) with what [`Self::commit`] needs.
    /// The caches are only read: the tokens run on private copies (in the workspace, at least
    /// [`Self::verify_workspace_len`]`(1, D, exec.workers())`). Each output is bitwise the
    /// output decode steps would give.
    pub fn verify(
        &self,
        x: &[f32],
        out: &mut [f32],
        rollback: Rollback<'_>,
        caches: CachesMut<'_>,
        workspace: &mut [f32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let d = rollback.drafts;
        if d == 0 {
            return Err(KdaError::Config {
                field: "drafts",
                reason: "must be at least 1",
            });
        }
        let tokens = self.rows(x, out)?;
        let n = rows_of("x (rows per sequence: drafts)", tokens, d)?;
        caches.validate(&self.cfg, n)?;
        check_len(
            "rollback record",
            rollback.data.len(),
            rollback_len(&self.cfg, n, d)?,
        )?;
        let needs = self.needs(Needs::verify());
        let size = BlockSize::fit(&self.cfg, workspace.len(), tokens, needs, exec.workers(), d)?;
        let views = VerifyViews {
            record: Shared::new(rollback.data),
            layout: RecordLayout {
                k: self.cfg.head_dim,
                drafts: d,
            },
            per_head: speculative::head_record_len(self.cfg.head_dim, d)?,
        };
        let call = Call {
            x,
            seqs: Sequences::Fixed { count: n, len: d },
            size,
            snaps: None,
            verify: Some(&views),
        };
        self.with_mode(Mode::Recurrent)
            .run(call, caches, out, workspace, exec)
    }

    /// Advances each sequence's caches by the first `accepted[s]` (`0..=D`) tokens of the
    /// [`Self::verify`] that filled `rollback` from these caches: afterwards they are bitwise
    /// what `accepted[s]` decode steps would have left. `workspace`: at least
    /// [`commit_workspace_len`]`(cfg, exec.workers())`. A record serves one commit.
    pub fn commit(
        &self,
        rollback: &Rollback<'_>,
        accepted: &[usize],
        caches: CachesMut<'_>,
        workspace: &mut [f32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        speculative::check_commit(&self.cfg, rollback, accepted, &caches)?;
        let need = commit_workspace_len(&self.cfg, exec.workers())?;
        if workspace.len() < need {
            return Err(KdaError::TooSmall {
                arg: "workspace",
                needed: need,
                actual: workspace.len(),
            });
        }
        let views = CommitViews {
            caches: CacheViews::new(caches),
            scratch: Shared::new(workspace),
        };
        speculative::commit_all(&self.cfg, self.isa, rollback, accepted, &views, exec)
    }
}

impl KdaLayer<'_> {
    /// The rows of `x` (`[T, hidden]`), with `out` checked to match.
    fn rows(&self, x: &[f32], out: &[f32]) -> Result<usize, KdaError> {
        let tokens = rows_of("x", x.len(), self.cfg.hidden)?;
        check_len("out", out.len(), x.len())?;
        Ok(tokens)
    }
}

/// What one validated call runs over.
struct Call<'a> {
    x: &'a [f32],
    seqs: Sequences<'a>,
    size: BlockSize,
    snaps: Option<&'a SnapViews<'a>>,
    verify: Option<&'a VerifyViews<'a>>,
}

impl<'a> Call<'a> {
    /// The snapshot positions of the call (empty without snapshots).
    fn snapshot_list(&self) -> &'a [SnapshotPos] {
        self.snaps.map_or(&[], |s| s.at)
    }
}

impl KdaLayer<'_> {
    /// The layer after validation: block by block, three rounds each.
    fn run(
        &self,
        call: Call<'_>,
        caches: CachesMut<'_>,
        out: &mut [f32],
        workspace: &mut [f32],
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let layout = call.size.layout(&self.cfg)?;
        let [q, k, v, decay, gate, beta, low_rank, pairs, scratch] = layout.carve(workspace)?;
        let bufs = BlockBuffers {
            q,
            k,
            v,
            decay,
            gate,
            beta,
            low_rank,
            pairs: bytemuck::cast_slice_mut(pairs),
            scratch: Shared::new(scratch),
        };
        let caches = CacheViews::new(caches);
        let out = Shared::new(out);
        let grid = |s: usize, t: usize| self.grid(&call, s, t);
        let mut bufs = bufs;
        for block in Blocks::new(call.seqs, call.size.tokens, &grid) {
            self.block(&call, &block, &mut bufs, &caches, &out, exec)?;
        }
        Ok(())
    }

    /// One block: the three rounds over rows `block.t0..block.t1`.
    fn block(
        &self,
        call: &Call<'_>,
        block: &Block,
        bufs: &mut BlockBuffers<'_>,
        caches: &CacheViews<'_>,
        out: &Shared<'_>,
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let (hidden, d, h) = (self.cfg.hidden, self.cfg.proj_dim(), self.cfg.heads);
        let (rf, rg) = plan::ranks(&self.cfg);
        let b = block.len();
        let x = &call.x[block.t0 * hidden..block.t1 * hidden];
        let q = Shared::new(&mut bufs.q[..b * d]);
        let k = Shared::new(&mut bufs.k[..b * d]);
        let v = Shared::new(&mut bufs.v[..b * d]);
        let decay = Shared::new(&mut bufs.decay[..b * d]);
        let gate = Shared::new(&mut bufs.gate[..b * d]);
        let beta = Shared::new(&mut bufs.beta[..b * h]);
        let low_rank = Shared::new(&mut bufs.low_rank[..b * (rf + rg)]);
        let round = Round {
            layer: self,
            tokens: b,
            scratch: &bufs.scratch,
            worker_len: call.size.worker_len,
        };
        let views = BlockViews {
            q: &q,
            k: &k,
            v: &v,
            decay: &decay,
            beta: &beta,
            gate: &gate,
            low_rank: &low_rank,
        };
        let pairs = &mut bufs.pairs[..b * call.size.pairs];
        round.input_projections(x, &views, pairs, exec)?;
        if rf + rg > 0 {
            // SAFETY: round 1 has finished; nothing else refers to the bottleneck rows now.
            let low = unsafe { low_rank.slice("bottleneck", 0, b * (rf + rg))? };
            round.low_rank_up(low, &views, pairs, exec)?;
        }
        let heads = HeadBuffers {
            block: &views,
            caches,
            snaps: call.snaps,
            verify: call.verify,
            scratch: &bufs.scratch,
            worker_len: call.size.worker_len,
            tokens: b,
        };
        self.seq_heads(call, block, &heads, exec)?;
        // SAFETY: round 2 has finished; the gate rows hold the normed rows, only read from here.
        let normed = unsafe { gate.slice("normed rows", 0, b * d)? };
        // SAFETY: this block's output rows are disjoint from every other block's, and within
        // the round each tile writes its own output columns.
        let rows = unsafe { out.slice("output rows", block.t0 * hidden, b * hidden)? };
        round.output(normed, &Shared::new(rows), pairs, exec)
    }

    /// Round 2: one task per (sequence, head) of the block.
    fn seq_heads(
        &self,
        call: &Call<'_>,
        block: &Block,
        heads: &HeadBuffers<'_>,
        exec: &dyn Executor,
    ) -> Result<(), KdaError> {
        let h = self.cfg.heads;
        let first_error = FirstError::default();
        exec.run(block.seqs * h, &|task, worker| {
            let Some(job) = self.piece(call, block, block.first_seq + task / h, task % h) else {
                return;
            };
            // SAFETY: tasks of one round have distinct (sequence, head) pairs, and the
            // Executor contract gives concurrently running tasks distinct workers.
            first_error.record(unsafe { heads.run(self, job, worker) });
        });
        first_error.take()
    }

    /// The piece of sequence `seq`, head `head` in `block`, or `None` if the sequence has no
    /// rows there.
    fn piece<'c>(
        &self,
        call: &Call<'c>,
        block: &Block,
        seq: usize,
        head: usize,
    ) -> Option<SeqHead<'c>> {
        let start = call.seqs.start(seq);
        let a = start.max(block.t0) - block.t0;
        let b = call.seqs.start(seq + 1).min(block.t1) - block.t0;
        if a >= b {
            return None;
        }
        let rel = block.t0 + a - start;
        let chunk = self.grid(call, seq, rel).map(|(c, origin)| {
            // Rows of this sequence already run since its grid started: the first chunk here
            // completes the grid.
            let phase = (rel - origin) % c;
            (c, if phase == 0 { c } else { c - phase })
        });
        let snaps = snapshot::snaps_in(call.snapshot_list(), seq, rel, rel + b - a);
        Some(SeqHead {
            seq,
            head,
            row: a,
            len: b - a,
            rel,
            chunk,
            snaps,
        })
    }

    /// The chunk grid of sequence `s` around its row `t`: `(chunk size, the grid's first row
    /// at or before t)` — the sequence start or the last snapshot position — or `None` when
    /// the sequence runs recurrent.
    fn grid(&self, call: &Call<'_>, s: usize, t: usize) -> Option<(usize, usize)> {
        let c = self.opts.chunk_for(call.seqs.len(s))?;
        Some((c, snapshot::grid_origin(call.snapshot_list(), s, t)))
    }
}

/// The workspace regions of a call.
struct BlockBuffers<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    decay: &'a mut [f32],
    gate: &'a mut [f32],
    beta: &'a mut [f32],
    low_rank: &'a mut [f32],
    pairs: &'a mut [u32],
    scratch: Shared<'a>,
}
