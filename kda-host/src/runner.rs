//! A runner that owns its workspace and runs any layer's weights (owned or memory-mapped).

use kda_core::{
    decode_step_with, forward_with, workspace_len, ForwardOptions, InitialCaches, KdaConfig,
    KdaError, KdaWeights,
};

use crate::cache::SequenceCaches;
use crate::error::HostError;
use crate::layer::OwnedLayer;

/// How a sequence forward is computed (the core's [`kda_core::Mode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Let the library choose: chunked for sequences of at least
    /// [`kda_core::AUTO_CHUNK_MIN_TOKENS`] tokens, recurrent below.
    #[default]
    Auto,
    /// Token-by-token recurrence.
    Recurrent,
    /// Chunked (WY/UT) form.
    Chunked,
}

impl Mode {
    /// The mode's name as the `kda` tool spells it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Recurrent => "recurrent",
            Mode::Chunked => "chunked",
        }
    }

    /// The path that actually runs for a sequence of `tokens` tokens.
    pub fn resolve(self, tokens: usize) -> Mode {
        match self {
            Mode::Auto if tokens >= kda_core::AUTO_CHUNK_MIN_TOKENS => Mode::Chunked,
            Mode::Auto => Mode::Recurrent,
            m => m,
        }
    }

    /// The core's options for this mode.
    pub fn options(self) -> ForwardOptions {
        ForwardOptions {
            mode: match self {
                Mode::Auto => kda_core::Mode::Auto,
                Mode::Recurrent => kda_core::Mode::Recurrent,
                Mode::Chunked => kda_core::Mode::Chunked,
            },
            ..ForwardOptions::default()
        }
    }
}

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

    fn workspace(
        &mut self,
        cfg: &KdaConfig,
        opts: &ForwardOptions,
        tokens: usize,
        workers: usize,
    ) -> Result<&mut [f32], HostError> {
        // Blocks of up to `max_block` (≥ AUTO_CHUNK_MIN_TOKENS) tokens: whenever some
        // sequence is long enough to run chunked, the block is too, so the chunk scratch that
        // `workspace_len` adds for this block size covers it.
        let block = tokens.clamp(1, self.max_block);
        let len = workspace_len(cfg, opts, block, workers)?;
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

    /// Sequence forward over packed sequences; returns `[T, hidden]`.
    pub fn forward(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: &mut SequenceCaches,
        init: InitialCaches,
    ) -> Result<Vec<f32>, HostError> {
        let w = layer.weights()?;
        self.forward_weights(&layer.cfg, &w, x, cu_seqlens, caches, init, Mode::Auto)
    }

    /// Sequence forward of any layer's weights (e.g. memory-mapped from a checkpoint) in the
    /// given mode; returns `[T, hidden]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_weights(
        &mut self,
        cfg: &KdaConfig,
        w: &KdaWeights<'_>,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: &mut SequenceCaches,
        init: InitialCaches,
        mode: Mode,
    ) -> Result<Vec<f32>, HostError> {
        let tokens = x.len() / cfg.hidden.max(1);
        let mut out = crate::error::try_zeroed(x.len(), "the output")?;
        let exec = crate::parallel::current();
        let opts = mode.options();
        let ws = self.workspace(cfg, &opts, tokens, exec.workers())?;
        let caches = caches.as_mut();
        forward_with(
            cfg, w, x, cu_seqlens, caches, init, &mut out, ws, &opts, exec,
        )?;
        Ok(out)
    }

    /// One decode step for every sequence of `caches`; `x` is `[N, hidden]`.
    pub fn decode(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        caches: &mut SequenceCaches,
    ) -> Result<Vec<f32>, HostError> {
        let w = layer.weights()?;
        self.decode_weights(&layer.cfg, &w, x, caches)
    }

    /// One decode step of any layer's weights for every sequence of `caches`.
    pub fn decode_weights(
        &mut self,
        cfg: &KdaConfig,
        w: &KdaWeights<'_>,
        x: &[f32],
        caches: &mut SequenceCaches,
    ) -> Result<Vec<f32>, HostError> {
        let mut out = vec![0.0; x.len()];
        let exec = crate::parallel::current();
        let opts = ForwardOptions::recurrent();
        let ws = self.workspace(cfg, &opts, caches.sequences, exec.workers())?;
        decode_step_with(cfg, w, x, caches.as_mut(), &mut out, ws, None, exec)
            .map_err(|e: KdaError| HostError::Core(e))?;
        Ok(out)
    }
}
