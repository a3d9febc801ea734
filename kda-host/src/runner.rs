//! A runner that owns its workspace and runs any layer's weights (owned or memory-mapped).

use kda_core::{Batch, InitialCaches, KdaLayer};

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

    /// The workspace for `tokens` tokens of `layer` (or a decode step when `decode`), grown
    /// as needed.
    fn workspace(
        &mut self,
        layer: &KdaLayer<'_>,
        tokens: usize,
        workers: usize,
        decode: bool,
    ) -> Result<&mut [f32], HostError> {
        // Blocks of up to `max_block` (≥ AUTO_CHUNK_MIN_TOKENS) tokens: whenever some
        // sequence is long enough to run chunked, the block is too, so the chunk scratch that
        // the sizing adds for this block size covers it.
        let block = tokens.clamp(1, self.max_block);
        let len = if decode {
            layer.decode_workspace_len(block, workers)?
        } else {
            layer.workspace_len(block, workers)?
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
        let ws = self.workspace(layer, tokens, exec.workers(), false)?;
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
        let ws = self.workspace(layer, caches.sequences, exec.workers(), true)?;
        layer.decode_step(x, &mut out, caches.as_mut(), ws, exec)?;
        Ok(out)
    }
}
