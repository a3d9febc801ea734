//! Round 2 of a block: one task per (sequence, head) for conv → L2 norm → delta rule
//! (recurrence or chunked) → gated RMSNorm.

use crate::error::KdaError;
use crate::exec::Shared;
use crate::ops::chunked::{chunked_head, Chunks};
use crate::ops::conv::{short_conv_prefill_scratch, short_conv_prefill_with};
use crate::ops::norm::{gated_rms_norm_row_into_gate, l2_norm};
use crate::ops::recurrent::{recurrent_head, recurrent_scratch_len};
use crate::ops::HeadRows;

use super::proj::BlockViews;
use super::speculative::VerifyViews;
use super::validated::KdaLayer;
use super::views::{CacheViews, SeqHead, SnapViews, Views};

/// The block's buffers and the caches, shared by the round's tasks. Each task touches only its
/// own head's rows of its own sequence, and its worker's scratch.
pub(super) struct HeadBuffers<'a> {
    /// q, k, v, decay and beta (head-major) and the output gate, which receives the normed
    /// rows.
    pub(super) block: &'a BlockViews<'a>,
    /// The caches: `[N, H, K, V]` recurrent states and `[N, H·K, W−1]` q, k, v conv states.
    pub(super) caches: &'a CacheViews<'a>,
    /// Where snapshots go, if the call takes any.
    pub(super) snaps: Option<&'a SnapViews<'a>>,
    /// The rollback record, in a speculative verify.
    pub(super) verify: Option<&'a VerifyViews<'a>>,
    /// `[workers, worker_len]` scratch.
    pub(super) scratch: &'a Shared<'a>,
    pub(super) worker_len: usize,
    /// Tokens in the block (the `B` of the head-major layouts).
    pub(super) tokens: usize,
}

/// The delta rule's scratch: the recurrence's, and the chunked kernel's.
struct DeltaScratch<'a> {
    recurrent: &'a mut [f32],
    chunked: &'a mut [f32],
}

impl<'a> HeadBuffers<'a> {
    /// The task's views.
    ///
    /// # Safety
    /// No other task running concurrently may use the same (sequence, head) or worker.
    unsafe fn views(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead<'_>,
        worker: usize,
    ) -> Result<Views<'a>, KdaError> {
        let cfg = &layer.cfg;
        let k = cfg.head_dim;
        let hist = cfg.conv_width - 1;
        let rows = job.head * self.tokens * k + job.row * k;
        let n = job.len * k;
        let state = job.seq * layer.state_len + job.head * k * k;
        let conv = job.seq * layer.conv_state_len + job.head * k * hist;
        // SAFETY: each (sequence, head) task gets the rows of its own head and sequence in the
        // head-major buffers, its own head's slice of its sequence's caches, and the scratch of
        // its worker index, which no concurrently running task shares (the caller's contract).
        unsafe {
            Ok(Views {
                q: self.block.q.slice("q rows", rows, n)?,
                k: self.block.k.slice("k rows", rows, n)?,
                v: self.block.v.slice("v rows", rows, n)?,
                decay: self.block.decay.slice("decay rows", rows, n)?,
                beta: self
                    .block
                    .beta
                    .slice("beta", job.head * self.tokens + job.row, job.len)?,
                state: self.caches.states.slice("recurrent state", state, k * k)?,
                conv: [
                    self.caches.conv[0].slice("q conv state", conv, k * hist)?,
                    self.caches.conv[1].slice("k conv state", conv, k * hist)?,
                    self.caches.conv[2].slice("v conv state", conv, k * hist)?,
                ],
                scratch: self.scratch.slice(
                    "worker scratch",
                    worker * self.worker_len,
                    self.worker_len,
                )?,
            })
        }
    }

    /// Conv → L2 norm → delta rule → gated norm for one (sequence, head) piece, on worker
    /// `worker`. In a verify, the caches are copied first and only the copies advance, and the
    /// rollback record is filled on the way.
    ///
    /// # Safety
    /// As [`Self::views`]: tasks running concurrently have distinct (sequence, head) pairs and
    /// distinct workers.
    pub(super) unsafe fn run<'w>(
        &self,
        layer: &KdaLayer<'w>,
        job: SeqHead<'_>,
        worker: usize,
    ) -> Result<(), KdaError> {
        // SAFETY: forwarded from the caller.
        let mut views = unsafe { self.views(layer, &job, worker)? };
        let cfg = &layer.cfg;
        let (hk, w) = (cfg.head_dim, cfg.conv_width);
        let scratch = core::mem::take(&mut views.scratch);
        let (conv_tmp, scratch) = scratch.split_at_mut(short_conv_prefill_scratch(w));
        let (rec_scratch, rest) = scratch.split_at_mut(recurrent_scratch_len(hk, hk));
        // A verify runs recurrent, so the chunked kernel's part of the scratch holds the
        // cache copies instead.
        let (mut verify, chunk_scratch) = match self.verify {
            // SAFETY: forwarded from the caller (one task per sequence and head).
            Some(v) => (
                Some(unsafe { v.begin(layer, &job, &mut views, rest)? }),
                &mut [][..],
            ),
            None => (None, rest),
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.convs(layer, &job, &mut views, conv_tmp)? };
        l2_norm(views.q, hk, cfg.l2_eps)?;
        l2_norm(views.k, hk, cfg.l2_eps)?;
        if let Some(v) = &mut verify {
            v.record_rows(&views);
        }
        let scratch = DeltaScratch {
            recurrent: rec_scratch,
            chunked: chunk_scratch,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.delta_rule(layer, &job, &mut views, scratch)? };
        self.gated_norm(layer, &job, views.v)
    }

    /// The convs of q, k and v, piece by piece between snapshots (each snapshot takes the conv
    /// states as they are after its position).
    ///
    /// # Safety
    /// As [`Self::run`].
    unsafe fn convs(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead<'_>,
        views: &mut Views<'_>,
        conv_tmp: &mut [f32],
    ) -> Result<(), KdaError> {
        let (hk, w) = (layer.cfg.head_dim, layer.cfg.conv_width);
        let weights = &layer.weights;
        let kernels = [weights.q_conv, weights.k_conv, weights.v_conv]
            .map(|data| data.slice(job.head * hk * w, hk * w));
        let [cq, ck, cv] = &mut views.conv;
        let mut start = 0;
        for (i, end) in self.cuts(job).enumerate() {
            for ((x, state), kernel) in [&mut *views.q, &mut *views.k, &mut *views.v]
                .into_iter()
                .zip([&mut **cq, &mut **ck, &mut **cv])
                .zip(kernels)
            {
                let x = &mut x[start * hk..end * hk];
                short_conv_prefill_with(layer.isa, x, hk, kernel, state, conv_tmp)?;
            }
            if i < job.snaps.at.len() {
                // SAFETY: forwarded from the caller (one task per sequence and head).
                unsafe { self.snapshot_conv(layer, job, i, [&**cq, &**ck, &**cv])? };
            }
            start = end;
        }
        Ok(())
    }

    /// The delta rule, piece by piece between snapshots; the chunk grid restarts at each.
    ///
    /// # Safety
    /// As [`Self::run`].
    unsafe fn delta_rule(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead<'_>,
        views: &mut Views<'_>,
        scratch: DeltaScratch<'_>,
    ) -> Result<(), KdaError> {
        let hk = layer.cfg.head_dim;
        let (isa, scale) = (layer.isa, layer.cfg.scale());
        let mut start = 0;
        for (i, end) in self.cuts(job).enumerate() {
            let span = start * hk..end * hk;
            let rows = HeadRows {
                q: &views.q[span.clone()],
                k: &views.k[span.clone()],
                g: &views.decay[span.clone()],
                beta: &views.beta[start..end],
                v_o: &mut views.v[span],
                state: &mut *views.state,
                scale,
            };
            match job.chunk {
                Some((size, first)) => {
                    let first = if i == 0 { first } else { size };
                    chunked_head(isa, rows, Chunks { size, first }, scratch.chunked)?
                }
                None => recurrent_head(isa, rows, scratch.recurrent)?,
            }
            let state = &*views.state;
            if i < job.snaps.at.len() {
                // SAFETY: forwarded from the caller.
                unsafe { self.snapshot_state(layer, job, i, state)? };
            }
            start = end;
        }
        Ok(())
    }

    /// The ends of the task's pieces: each snapshot position in it (as a row of the piece;
    /// the `i`-th cut is snapshot `i`), then its end unless a snapshot is already there.
    fn cuts<'j>(&self, job: &'j SeqHead<'_>) -> impl Iterator<Item = usize> + 'j {
        let snaps = job.snaps.at.iter().map(move |p| p.pos - job.rel);
        let at_end = job
            .snaps
            .at
            .last()
            .is_some_and(|p| p.pos - job.rel == job.len);
        snaps.chain((!at_end).then_some(job.len))
    }

    /// Copies this head's conv states into snapshot `i` of the piece.
    ///
    /// # Safety
    /// One task per (sequence, head): a snapshot's head slice is written by one task only.
    unsafe fn snapshot_conv(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead<'_>,
        i: usize,
        conv: [&[f32]; 3],
    ) -> Result<(), KdaError> {
        let Some(snaps) = self.snaps else {
            return Ok(());
        };
        let len = layer.cfg.head_dim * (layer.cfg.conv_width - 1);
        let at = (job.snaps.first + i) * layer.conv_state_len + job.head * len;
        for (dst, src) in snaps.caches.conv.iter().zip(conv) {
            // SAFETY: the caller's contract; the slice is this head's part of this snapshot.
            unsafe { dst.slice("snapshot conv state", at, len)? }.copy_from_slice(src);
        }
        Ok(())
    }

    /// Copies this head's recurrent state into snapshot `i` of the piece.
    ///
    /// # Safety
    /// As [`Self::snapshot_conv`].
    unsafe fn snapshot_state(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead<'_>,
        i: usize,
        state: &[f32],
    ) -> Result<(), KdaError> {
        let Some(snaps) = self.snaps else {
            return Ok(());
        };
        let at = (job.snaps.first + i) * layer.state_len + job.head * state.len();
        // SAFETY: the caller's contract; the slice is this head's part of this snapshot.
        unsafe {
            snaps
                .caches
                .states
                .slice("snapshot state", at, state.len())?
        }
        .copy_from_slice(state);
        Ok(())
    }

    /// Gated RMSNorm of the task's output rows `o` into its columns of the gate rows.
    fn gated_norm(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead<'_>,
        o: &[f32],
    ) -> Result<(), KdaError> {
        let cfg = &layer.cfg;
        let (hk, d) = (cfg.head_dim, cfg.proj_dim());
        for (t, row) in o.chunks_exact(hk).enumerate() {
            // SAFETY: row `job.row + t` of this head's columns in the token-major gate buffer
            // belongs to this task alone.
            let gate = unsafe {
                self.block
                    .gate
                    .slice("gate row", (job.row + t) * d + job.head * hk, hk)?
            };
            gated_rms_norm_row_into_gate(layer.isa, row, gate, layer.weights.o_norm, cfg.rms_eps);
        }
        Ok(())
    }
}
