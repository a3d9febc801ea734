//! A runner that owns its workspace and runs any layer's weights (owned or memory-mapped).

use kda_core::{
    commit_workspace_len, rollback_len, Batch, InitialCaches, KdaLayer, Rollback, SnapshotPos,
    Snapshots,
};

use crate::cache::SequenceCaches;
use crate::error::HostError;

/// Runs layers with a workspace it owns and grows as needed (at most `max_block` tokens per
/// block, so memory stays bounded for long prompts).
#[derive(Debug, Clone)]
pub struct Runner {
    workspace: Vec<f32>,
    max_block: usize,
}

impl Default for Runner {
    fn default() -> Self {
        Runner::new(256)
    }
}

impl Runner {
    /// A runner processing up to `max_block` tokens per block (at least
    /// [`kda_core::AUTO_CHUNK_MIN_TOKENS`]).
    pub fn new(max_block: usize) -> Self {
        Runner {
            workspace: Vec::new(),
            max_block: max_block.max(kda_core::AUTO_CHUNK_MIN_TOKENS),
        }
    }

    /// The workspace for `tokens` tokens of `layer` in a call of kind `kind`, grown as needed.
    fn workspace(
        &mut self,
        layer: &KdaLayer<'_>,
        tokens: usize,
        workers: usize,
        kind: Call,
    ) -> Result<&mut [f32], HostError> {
        // Blocks of up to `max_block` (≥ AUTO_CHUNK_MIN_TOKENS) tokens: whenever some
        // sequence is long enough to run chunked, the block is too, so the chunk scratch that
        // the sizing adds for this block size covers it.
        let block = tokens.clamp(1, self.max_block);
        let len = match kind {
            Call::Forward => layer.workspace_len(block, workers)?,
            Call::Decode => layer.decode_workspace_len(block, workers)?,
            // Whole sequences of `drafts` tokens per block.
            Call::Verify { drafts } => {
                layer.verify_workspace_len(block.div_ceil(drafts).max(1), drafts, workers)?
            }
            Call::Commit => commit_workspace_len(layer.config(), workers)?,
        };
        if self.workspace.len() < len {
            let extra = len - self.workspace.len();
            self.workspace
                .try_reserve_exact(extra)
                .map_err(|_| HostError::Alloc {
                    what: "workspace".into(),
                    bytes: 4 * len as u128,
                })?;
            self.workspace.resize(len, 0.0);
        }
        Ok(&mut self.workspace[..len])
    }

    /// Sequence forward of `layer` over packed sequences `x` `[T, hidden]` on the current
    /// rayon pool; returns `[T, hidden]`.
    pub fn forward(
        &mut self,
        layer: &KdaLayer<'_>,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: &mut SequenceCaches,
        init: InitialCaches,
    ) -> Result<Vec<f32>, HostError> {
        let tokens = x.len() / layer.config().hidden.max(1);
        let mut out = crate::error::try_zeroed(x.len(), "the output")?;
        let exec = crate::parallel::current();
        let ws = self.workspace(layer, tokens, exec.workers(), Call::Forward)?;
        let batch = Batch {
            x,
            cu_seqlens,
            out: &mut out,
        };
        layer.forward(batch, caches.as_mut(), init, ws, exec)?;
        Ok(out)
    }

    /// One decode step of `layer` for every sequence of `caches`; `x` is `[N, hidden]`.
    pub fn decode(
        &mut self,
        layer: &KdaLayer<'_>,
        x: &[f32],
        caches: &mut SequenceCaches,
    ) -> Result<Vec<f32>, HostError> {
        let mut out = crate::error::try_zeroed(x.len(), "the output")?;
        let exec = crate::parallel::current();
        let ws = self.workspace(layer, caches.sequences, exec.workers(), Call::Decode)?;
        layer.decode_step(x, &mut out, caches.as_mut(), ws, exec)?;
        Ok(out)
    }

    /// [`Runner::forward`] that also returns the caches after the tokens listed in `at` (sorted
    /// by sequence then position; see [`kda_core::Snapshots`]), as `at.len()` sequences'
    /// caches in that order.
    pub fn forward_with_snapshots(
        &mut self,
        layer: &KdaLayer<'_>,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: &mut SequenceCaches,
        init: InitialCaches,
        at: &[SnapshotPos],
    ) -> Result<(Vec<f32>, SequenceCaches), HostError> {
        let tokens = x.len() / layer.config().hidden.max(1);
        let mut out = crate::error::try_zeroed(x.len(), "the output")?;
        let mut snaps = SequenceCaches::try_new(layer.config(), at.len())?;
        let exec = crate::parallel::current();
        let ws = self.workspace(layer, tokens, exec.workers(), Call::Forward)?;
        let batch = Batch {
            x,
            cu_seqlens,
            out: &mut out,
        };
        let s = Snapshots {
            at,
            states: snaps.as_mut(),
        };
        layer.forward_with_snapshots(batch, s, caches.as_mut(), init, ws, exec)?;
        Ok((out, snaps))
    }

    /// A speculative verify of `drafts` tokens for every sequence of `caches` (`x`:
    /// `[N·drafts, hidden]`): the outputs and the rollback record (the caches are only read).
    pub fn verify(
        &mut self,
        layer: &KdaLayer<'_>,
        x: &[f32],
        drafts: usize,
        caches: &mut SequenceCaches,
    ) -> Result<(Vec<f32>, Vec<f32>), HostError> {
        let n = caches.sequences;
        let mut out = crate::error::try_zeroed(x.len(), "the output")?;
        let len = rollback_len(layer.config(), n, drafts)?;
        let mut record = crate::error::try_zeroed(len, "the rollback record")?;
        let exec = crate::parallel::current();
        let tokens = n.saturating_mul(drafts);
        let ws = self.workspace(layer, tokens, exec.workers(), Call::Verify { drafts })?;
        let rb = Rollback {
            drafts,
            data: &mut record,
        };
        layer.verify(x, &mut out, rb, caches.as_mut(), ws, exec)?;
        Ok((out, record))
    }

    /// Commits the first `accepted[s]` drafts of each sequence from a [`Runner::verify`]
    /// record of `drafts` tokens.
    pub fn commit(
        &mut self,
        layer: &KdaLayer<'_>,
        record: &mut [f32],
        drafts: usize,
        accepted: &[usize],
        caches: &mut SequenceCaches,
    ) -> Result<(), HostError> {
        let exec = crate::parallel::current();
        let ws = self.workspace(layer, 1, exec.workers(), Call::Commit)?;
        let rb = Rollback {
            drafts,
            data: record,
        };
        layer.commit(&rb, accepted, caches.as_mut(), ws, exec)?;
        Ok(())
    }
}

/// What a workspace is for.
#[derive(Debug, Clone, Copy)]
enum Call {
    Forward,
    Decode,
    Verify { drafts: usize },
    Commit,
}
