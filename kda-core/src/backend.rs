//! The execution trait every backend implements (CPU here, CUDA in `kda-cuda`).
//!
//! **Why layer-level.** The trait's unit of work is a whole layer call (sequence forward or
//! decode step), not one op. A GPU backend wins by fusing across ops — conv + gate + L2 norm +
//! recurrence + gated norm in one decode kernel — which an op-by-op trait would forbid or
//! force through device-to-device round trips. The ops themselves are still public functions
//! in [`crate::ops`], each tested against the reference, and a conformance suite compares every
//! backend's layer output against the CPU one on the same fixtures.
//!
//! **Buffers are associated types** (generic over the borrow's lifetime), so the CPU backend
//! works on `&[f32]` slices while a GPU backend takes device allocations for activations,
//! caches and workspace. Offsets (`cu_seqlens`) are always host slices: they are validated on
//! the host before any launch.

use crate::cache::CachesMut;
use crate::config::KdaConfig;
use crate::error::KdaError;
use crate::exec::{Executor, Serial};
use crate::layer::{self, Batch, ForwardOptions, InitialCaches, KdaLayer, Mode};

/// A device that can run KDA layers.
pub trait KdaBackend {
    /// The backend's error; every core validation error converts into it.
    type Error: From<KdaError> + core::fmt::Debug;
    /// Layer weights as the backend stores them (for the CPU backend, a validated
    /// [`KdaLayer`]).
    type Weights<'a>;
    /// Input rows `[T, hidden]`.
    type Input<'a>;
    /// Output rows `[T, hidden]`.
    type Output<'a>;
    /// The caches of `N` sequences (layouts of [`crate::cache`]).
    type Caches<'a>;
    /// Scratch memory for one call.
    type Workspace<'a>;

    /// Workspace (in the units of [`Self::Workspace`]) for a forward over up to `tokens` tokens.
    fn forward_workspace_len(&self, cfg: &KdaConfig, tokens: usize) -> Result<usize, Self::Error>;

    /// Workspace for a decode step over `batch` sequences.
    fn decode_workspace_len(&self, cfg: &KdaConfig, batch: usize) -> Result<usize, Self::Error>;

    /// Sequence forward over packed sequences (see [`KdaLayer::forward`] for the contract).
    /// `cfg` must be the configuration the weights were loaded for.
    // KdaLayer::forward's arguments in each backend's own buffer types (the trait's contract).
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &mut self,
        cfg: &KdaConfig,
        weights: &Self::Weights<'_>,
        x: Self::Input<'_>,
        cu_seqlens: &[usize],
        caches: Self::Caches<'_>,
        init: InitialCaches,
        out: Self::Output<'_>,
        workspace: Self::Workspace<'_>,
    ) -> Result<(), Self::Error>;

    /// One token for each of `N` sequences (see [`KdaLayer::decode_step`]).
    fn decode_step(
        &mut self,
        cfg: &KdaConfig,
        weights: &Self::Weights<'_>,
        x: Self::Input<'_>,
        caches: Self::Caches<'_>,
        out: Self::Output<'_>,
        workspace: Self::Workspace<'_>,
    ) -> Result<(), Self::Error>;
}

/// The allocation-free CPU backend over borrowed slices: options for the workspace sizes,
/// and an executor (in order by default; the host crate supplies a threaded one). Its weights
/// are a [`KdaLayer`], validated once when it was built.
#[derive(Debug, Default, Clone, Copy)]
pub struct Cpu<E = Serial> {
    /// Mode, chunk size and kernel path the workspace sizes are computed for.
    pub opts: ForwardOptions,
    /// Runs the layer's independent tasks.
    pub exec: E,
}

/// `Ok` when `cfg` is the layer's configuration.
fn same_config(cfg: &KdaConfig, layer: &KdaLayer<'_>) -> Result<(), KdaError> {
    if cfg == layer.config() {
        Ok(())
    } else {
        Err(KdaError::Config {
            field: "cfg",
            reason: "differs from the configuration the layer was built with",
        })
    }
}

impl<E: Executor> KdaBackend for Cpu<E> {
    type Error = KdaError;
    type Weights<'a> = KdaLayer<'a>;
    type Input<'a> = &'a [f32];
    type Output<'a> = &'a mut [f32];
    type Caches<'a> = CachesMut<'a>;
    type Workspace<'a> = &'a mut [f32];

    fn forward_workspace_len(&self, cfg: &KdaConfig, tokens: usize) -> Result<usize, KdaError> {
        layer::workspace_len(cfg, &self.opts, tokens, self.exec.workers())
    }

    fn decode_workspace_len(&self, cfg: &KdaConfig, batch: usize) -> Result<usize, KdaError> {
        let opts = self.opts.with_mode(Mode::Recurrent);
        layer::workspace_len(cfg, &opts, batch, self.exec.workers())
    }

    fn forward(
        &mut self,
        cfg: &KdaConfig,
        layer: &KdaLayer<'_>,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: CachesMut<'_>,
        init: InitialCaches,
        out: &mut [f32],
        workspace: &mut [f32],
    ) -> Result<(), KdaError> {
        same_config(cfg, layer)?;
        let batch = Batch { x, cu_seqlens, out };
        layer.forward(batch, caches, init, workspace, &self.exec)
    }

    fn decode_step(
        &mut self,
        cfg: &KdaConfig,
        layer: &KdaLayer<'_>,
        x: &[f32],
        caches: CachesMut<'_>,
        out: &mut [f32],
        workspace: &mut [f32],
    ) -> Result<(), KdaError> {
        same_config(cfg, layer)?;
        layer.decode_step(x, out, caches, workspace, &self.exec)
    }
}
