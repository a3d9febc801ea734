//! Speculative decoding without per-token state copies: [`KdaLayer::verify`] runs `D` draft
//! tokens of each sequence on private copies of its caches and fills a compact
//! [`Rollback`] record; [`KdaLayer::commit`] then advances the caches by the first `n` of them
//! (per sequence) by replaying `n` rank-1 updates from the untouched start state.
//!
//! The record holds, per sequence, head and draft token, what the replay needs: the
//! normalised key (`K`), the value after its conv (`V`), the log-decay (`K`), beta, and the
//! raw projected q, k, v inputs of the convs (`3K`) — `D·H·(5K + V + 1)` floats per sequence,
//! against `D·H·K·V` for `D` copies of the state. The replay runs the same kernels in the same
//! order as decoding, so `verify` + `commit(n)` leaves the caches bitwise as `n` decode steps
//! would, and the first `n` outputs of `verify` are bitwise those decode steps' outputs.

use crate::cache::CachesMut;
use crate::config::KdaConfig;
use crate::error::{add, check_len, mul, KdaError};
use crate::exec::{Executor, FirstError, Shared};
use crate::ops::recurrent::{replay_step, ReplayToken};
use crate::simd::{self, Isa};

use super::validated::KdaLayer;
use super::views::{CacheViews, SeqHead, Views};

/// f32 elements of the record of one (sequence, head) for `drafts` tokens and key dim `k`
/// (value dim `k` too): `drafts · (5k + k + 1)`.
pub(super) fn head_record_len(k: usize, drafts: usize) -> Result<usize, KdaError> {
    let per_token = add("rollback record", mul("rollback record", 6, k)?, 1)?;
    mul("rollback record", per_token, drafts)
}

/// f32 elements of a [`Rollback`] record for `sequences` sequences of `drafts` draft tokens.
pub fn rollback_len(cfg: &KdaConfig, sequences: usize, drafts: usize) -> Result<usize, KdaError> {
    cfg.validate()?;
    let per_head = head_record_len(cfg.head_dim, drafts)?;
    mul(
        "rollback record",
        mul("rollback record", per_head, cfg.heads)?,
        sequences,
    )
}

/// f32 elements of workspace [`KdaLayer::commit`](super::KdaLayer::commit) needs on an
/// executor with `workers` workers.
pub fn commit_workspace_len(cfg: &KdaConfig, workers: usize) -> Result<usize, KdaError> {
    cfg.validate()?;
    let per_worker = mul("commit workspace", 4, cfg.head_dim)?;
    mul("commit workspace", per_worker, workers.max(1))
}

/// The record of one [`KdaLayer::verify`](super::KdaLayer::verify) call: `drafts` tokens for
/// each sequence, in a caller buffer of [`rollback_len`] elements. Valid for one
/// [`KdaLayer::commit`](super::KdaLayer::commit) against the caches it was verified from.
#[derive(Debug)]
pub struct Rollback<'a> {
    /// Draft tokens per sequence (`D ≥ 1`).
    pub drafts: usize,
    /// The record, `[N, H, D·(6K + 1)]`.
    pub data: &'a mut [f32],
}

/// Where one token's entries lie in a (sequence, head) record: `[D, K]` keys, `[D, V]`
/// values, `[D, K]` log-decays, `[D]` betas, then `[D, K]` raw conv inputs of q, k and v.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecordLayout {
    pub(super) k: usize,
    pub(super) drafts: usize,
}

impl RecordLayout {
    /// Offsets of the parts within one (sequence, head) record.
    fn key(&self, t: usize) -> core::ops::Range<usize> {
        t * self.k..(t + 1) * self.k
    }
    fn value(&self, t: usize) -> core::ops::Range<usize> {
        let base = self.drafts * self.k;
        base + t * self.k..base + (t + 1) * self.k
    }
    fn decay(&self, t: usize) -> core::ops::Range<usize> {
        let base = 2 * self.drafts * self.k;
        base + t * self.k..base + (t + 1) * self.k
    }
    fn beta(&self, t: usize) -> usize {
        3 * self.drafts * self.k + t
    }
    /// Raw inputs of conv `which` (0: q, 1: k, 2: v) for tokens `0..n`, `[n, K]`.
    fn conv_in(&self, which: usize, n: usize) -> core::ops::Range<usize> {
        let base = 3 * self.drafts * self.k + self.drafts + which * self.drafts * self.k;
        base..base + n * self.k
    }

    /// Records one head's `rows` tokens: raw conv inputs (`raw`, before the conv), then —
    /// after the conv and norms — the keys, values, log-decays and betas.
    pub(super) fn store_raw(&self, rec: &mut [f32], raw: [&[f32]; 3]) {
        for (which, src) in raw.into_iter().enumerate() {
            rec[self.conv_in(which, src.len() / self.k)].copy_from_slice(src);
        }
    }

    /// Records the normalised keys, conv'd values, log-decays and betas of the tokens.
    pub(super) fn store_rows(
        &self,
        rec: &mut [f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
    ) {
        for (t, &b) in beta.iter().enumerate() {
            let row = t * self.k..(t + 1) * self.k;
            rec[self.key(t)].copy_from_slice(&k[row.clone()]);
            rec[self.value(t)].copy_from_slice(&v[row.clone()]);
            rec[self.decay(t)].copy_from_slice(&g[row]);
            rec[self.beta(t)] = b;
        }
    }
}

/// Replays the first `n` recorded tokens of one head onto its caches: `state` `[K, V]` and
/// the conv states `[K, W−1]`. `scratch`: `4K` floats.
pub(super) fn replay(
    isa: Isa,
    layout: &RecordLayout,
    rec: &[f32],
    n: usize,
    state: &mut [f32],
    conv: [&mut [f32]; 3],
    scratch: &mut [f32],
) -> Result<(), KdaError> {
    let k = layout.k;
    let (zeros, rest) = scratch.split_at_mut(k);
    let (decay, rest) = rest.split_at_mut(k);
    let (delta, out) = rest.split_at_mut(k);
    zeros.fill(0.0);
    for t in 0..n {
        decay.copy_from_slice(&rec[layout.decay(t)]);
        simd::exp_in_place(isa, decay);
        delta.copy_from_slice(&rec[layout.value(t)]);
        let token = ReplayToken {
            k: &rec[layout.key(t)],
            beta: rec[layout.beta(t)],
            zeros,
            decay,
        };
        replay_step(isa, state, &token, delta, &mut out[..k]);
    }
    for (which, c) in conv.into_iter().enumerate() {
        shift_conv_state(c, &rec[layout.conv_in(which, n)], k)?;
    }
    Ok(())
}

/// Appends `raw` (`[n, K]` raw inputs) to a conv state `[K, W−1]` (oldest first per channel),
/// keeping the last `W−1` of each channel.
fn shift_conv_state(state: &mut [f32], raw: &[f32], k: usize) -> Result<(), KdaError> {
    let hist = state.len() / k.max(1);
    check_len("conv state", state.len(), hist * k)?;
    let n = raw.len() / k.max(1);
    for c in 0..k {
        let row = &mut state[c * hist..(c + 1) * hist];
        if n >= hist {
            for (j, s) in row.iter_mut().enumerate() {
                *s = raw[(n - hist + j) * k + c];
            }
        } else {
            row.copy_within(n.., 0);
            for j in 0..n {
                row[hist - n + j] = raw[j * k + c];
            }
        }
    }
    Ok(())
}

/// The rollback record of a verify, shared by its (sequence, head) tasks.
pub(super) struct VerifyViews<'a> {
    pub(super) record: Shared<'a>,
    pub(super) layout: RecordLayout,
    pub(super) per_head: usize,
}

impl<'a> VerifyViews<'a> {
    /// Starts a verify task: records the raw conv inputs of its tokens, copies its caches into
    /// `copies` (at least [`verify_scratch_len`](super::plan::verify_scratch_len)) and points
    /// `views` at the copies, so the caches themselves stay as they are.
    ///
    /// # Safety
    /// One task per (sequence, head): its part of the record is written by it alone.
    pub(super) unsafe fn begin<'t>(
        &self,
        layer: &KdaLayer<'_>,
        job: &SeqHead<'_>,
        views: &mut Views<'t>,
        copies: &'t mut [f32],
    ) -> Result<VerifyTask<'a>, KdaError> {
        let task = job.seq * layer.cfg.heads + job.head;
        // SAFETY: the caller's contract.
        let rec = unsafe {
            self.record
                .slice("rollback record", task * self.per_head, self.per_head)?
        };
        self.layout
            .store_raw(rec, [&*views.q, &*views.k, &*views.v]);
        let (state, rest) = copies.split_at_mut(views.state.len());
        state.copy_from_slice(views.state);
        views.state = state;
        let mut rest = rest;
        for c in views.conv.iter_mut() {
            let (copy, tail) = core::mem::take(&mut rest).split_at_mut(c.len());
            copy.copy_from_slice(c);
            *c = copy;
            rest = tail;
        }
        Ok(VerifyTask {
            rec,
            layout: self.layout,
        })
    }
}

/// One verify task's part of the record.
pub(super) struct VerifyTask<'a> {
    rec: &'a mut [f32],
    layout: RecordLayout,
}

impl VerifyTask<'_> {
    /// Records the normalised keys, conv'd values, log-decays and betas of the task's tokens
    /// (before the delta rule overwrites the values).
    pub(super) fn record_rows(&mut self, v: &Views<'_>) {
        self.layout.store_rows(self.rec, v.k, v.v, v.decay, v.beta);
    }
}

/// The caches of a commit and its workers' scratch, shared by its (sequence, head) tasks.
pub(super) struct CommitViews<'a> {
    pub(super) caches: CacheViews<'a>,
    pub(super) scratch: Shared<'a>,
}

/// Runs the replay of every (sequence, head) with `accepted[s]` tokens on `exec`.
pub(super) fn commit_all(
    cfg: &KdaConfig,
    isa: Isa,
    rollback: &Rollback<'_>,
    accepted: &[usize],
    views: &CommitViews<'_>,
    exec: &dyn Executor,
) -> Result<(), KdaError> {
    let (h, k) = (cfg.heads, cfg.head_dim);
    let hist = cfg.conv_width - 1;
    let layout = RecordLayout {
        k,
        drafts: rollback.drafts,
    };
    let per_head = head_record_len(k, rollback.drafts)?;
    let first_error = FirstError::default();
    exec.run(accepted.len() * h, &|task, worker| {
        let (s, head) = (task / h, task % h);
        // SAFETY: each task owns its (sequence, head) slice of each cache and the scratch of
        // its worker (Executor contract).
        let r = unsafe {
            (|| {
                let rec = rollback
                    .data
                    .get(task * per_head..(task + 1) * per_head)
                    .ok_or(KdaError::Internal {
                        what: "rollback record",
                    })?;
                let caches = &views.caches;
                let state =
                    caches
                        .states
                        .slice("recurrent state", (s * h + head) * k * k, k * k)?;
                let at = (s * h + head) * k * hist;
                let conv = [
                    caches.conv[0].slice("q conv state", at, k * hist)?,
                    caches.conv[1].slice("k conv state", at, k * hist)?,
                    caches.conv[2].slice("v conv state", at, k * hist)?,
                ];
                let scratch = views
                    .scratch
                    .slice("commit scratch", worker * 4 * k, 4 * k)?;
                replay(isa, &layout, rec, accepted[s], state, conv, scratch)
            })()
        };
        first_error.record(r);
    });
    first_error.take()
}

/// Checks a commit's arguments.
pub(super) fn check_commit(
    cfg: &KdaConfig,
    rollback: &Rollback<'_>,
    accepted: &[usize],
    caches: &CachesMut<'_>,
) -> Result<(), KdaError> {
    let n = accepted.len();
    caches.validate(cfg, n)?;
    check_len(
        "rollback record",
        rollback.data.len(),
        rollback_len(cfg, n, rollback.drafts)?,
    )?;
    if accepted.iter().any(|&a| a > rollback.drafts) {
        return Err(KdaError::Config {
            field: "accepted",
            reason: "a sequence accepts more tokens than were drafted",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_state_keeps_the_last_inputs() {
        // K = 2 channels, W − 1 = 3: channel 0 history [1, 2, 3], channel 1 [4, 5, 6].
        let mut st = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        // Two tokens: (7, 8), (9, 10).
        shift_conv_state(&mut st, &[7.0, 8.0, 9.0, 10.0], 2).unwrap();
        assert_eq!(st, [3.0, 7.0, 9.0, 6.0, 8.0, 10.0]);
        // Four tokens replace everything.
        shift_conv_state(&mut st, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 2).unwrap();
        assert_eq!(st, [3.0, 5.0, 7.0, 4.0, 6.0, 8.0]);
        // None keeps it.
        shift_conv_state(&mut st, &[], 2).unwrap();
        assert_eq!(st, [3.0, 5.0, 7.0, 4.0, 6.0, 8.0]);
    }
}
