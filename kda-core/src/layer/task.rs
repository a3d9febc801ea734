//! Round 2 of a block: one task per (sequence, head) for conv → L2 norm → delta rule
//! (recurrence or chunked) → gated RMSNorm.

use crate::error::KdaError;
use crate::exec::Shared;
use crate::ops::chunked::chunked_head;
use crate::ops::conv::{short_conv_prefill, short_conv_prefill_scratch};
use crate::ops::norm::{gated_rms_norm_row_into_gate, l2_norm};
use crate::ops::recurrent::{recurrent_head, recurrent_scratch_len};
use crate::weights::Data;

use super::proj::BlockViews;
use super::KdaLayer;

/// The block's buffers and the caches, shared by the round's tasks. Each task touches only its
/// own head's rows of its own sequence, and its worker's scratch.
pub(super) struct HeadBuffers<'a> {
    /// q, k, v, decay and beta (head-major) and the output gate, which receives the normed
    /// rows.
    pub(super) block: &'a BlockViews<'a>,
    /// `[N, H, K, V]` recurrent states and `[N, H·K, W−1]` q, k, v conv states.
    pub(super) states: &'a Shared<'a>,
    pub(super) conv: [&'a Shared<'a>; 3],
    /// `[workers, worker_len]` scratch.
    pub(super) scratch: &'a Shared<'a>,
    pub(super) worker_len: usize,
    /// Tokens in the block (the `B` of the head-major layouts).
    pub(super) tokens: usize,
}

/// One (sequence, head) piece of a block.
#[derive(Debug, Clone, Copy)]
pub(super) struct SeqHead {
    /// Sequence index in the call.
    pub(super) seq: usize,
    pub(super) head: usize,
    /// First row of the sequence within the block, and its row count there.
    pub(super) row: usize,
    pub(super) len: usize,
    /// `(chunk size, length of the first chunk)` when the sequence runs chunked.
    pub(super) chunk: Option<(usize, usize)>,
}

/// The views one task works on.
struct Views<'a> {
    q: &'a mut [f32],
    k: &'a mut [f32],
    v: &'a mut [f32],
    decay: &'a mut [f32],
    beta: &'a mut [f32],
    state: &'a mut [f32],
    conv: [&'a mut [f32]; 3],
    scratch: &'a mut [f32],
}

impl<'a> HeadBuffers<'a> {
    /// The task's views.
    ///
    /// # Safety
    /// No other task running concurrently may use the same (sequence, head) or worker.
    unsafe fn views(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead,
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
                state: self.states.slice("recurrent state", state, k * k)?,
                conv: [
                    self.conv[0].slice("q conv state", conv, k * hist)?,
                    self.conv[1].slice("k conv state", conv, k * hist)?,
                    self.conv[2].slice("v conv state", conv, k * hist)?,
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
    /// `worker`.
    ///
    /// # Safety
    /// As [`Self::views`]: tasks running concurrently have distinct (sequence, head) pairs and
    /// distinct workers.
    pub(super) unsafe fn run<'w>(
        &self,
        layer: &KdaLayer<'w>,
        job: SeqHead,
        worker: usize,
    ) -> Result<(), KdaError> {
        // SAFETY: forwarded from the caller.
        let views = unsafe { self.views(layer, &job, worker)? };
        let Views {
            q,
            k,
            v,
            decay,
            beta,
            state,
            conv: [cq, ck, cv],
            scratch,
        } = views;
        let cfg = &layer.cfg;
        let (hk, w) = (cfg.head_dim, cfg.conv_width);
        let (conv_tmp, scratch) = scratch.split_at_mut(short_conv_prefill_scratch(w));
        let (rec_scratch, chunk_scratch) = scratch.split_at_mut(recurrent_scratch_len(hk, hk));
        let conv_w = |data: Data<'w>| data.slice(job.head * hk * w, hk * w);
        let weights = &layer.weights;
        short_conv_prefill(q, hk, conv_w(weights.q_conv), cq, conv_tmp)?;
        short_conv_prefill(k, hk, conv_w(weights.k_conv), ck, conv_tmp)?;
        short_conv_prefill(v, hk, conv_w(weights.v_conv), cv, conv_tmp)?;
        l2_norm(q, hk, cfg.l2_eps)?;
        l2_norm(k, hk, cfg.l2_eps)?;
        let (isa, scale) = (layer.isa, cfg.scale());
        match job.chunk {
            Some((c, first)) => chunked_head(
                isa,
                q,
                k,
                v,
                decay,
                beta,
                scale,
                state,
                c,
                first,
                chunk_scratch,
            )?,
            None => recurrent_head(isa, q, k, v, decay, beta, scale, state, rec_scratch)?,
        }
        self.gated_norm(layer, &job, v)
    }

    /// Gated RMSNorm of the task's output rows `o` into its columns of the gate rows.
    fn gated_norm(&self, layer: &KdaLayer<'_>, job: &SeqHead, o: &[f32]) -> Result<(), KdaError> {
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
            gated_rms_norm_row_into_gate(row, gate, layer.weights.o_norm, cfg.rms_eps);
        }
        Ok(())
    }
}
