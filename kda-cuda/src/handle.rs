//! [`CudaBackend`] itself: the device it opened and its options, which every buffer and set
//! of weights is made through. What it runs is in `backend.rs`.

use kda_core::{KdaConfig, Mode};

use crate::device::Device;
use crate::error::CudaError;
use crate::plan::{choose_chunk, LayerDims};
use crate::probe::DeviceInfo;

/// How forward calls run the delta rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// [`Mode::Recurrent`] (`kda_recurrent`), [`Mode::Chunked`], or [`Mode::Auto`]: chunked when
    /// the call's longest sequence has at least
    /// [`AUTO_CHUNK_MIN_TOKENS`](crate::plan::AUTO_CHUNK_MIN_TOKENS) tokens.
    pub mode: Mode,
    /// Chunk size (1..=64); `None` picks the largest of 64, 32, 16 that fits the device's
    /// shared memory for the head dim.
    pub chunk_size: Option<usize>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            mode: Mode::Auto,
            chunk_size: None,
        }
    }
}

/// The KDA layer on one CUDA device.
///
/// Create with [`CudaBackend::new`] (an error, [`CudaError::NoDevice`], on machines without a
/// usable GPU — never a panic). Buffers ([`DeviceRows`](crate::DeviceRows),
/// [`DeviceCaches`](crate::DeviceCaches), [`DeviceWorkspace`](crate::DeviceWorkspace),
/// [`DeviceWeights`](crate::DeviceWeights)) are made through a backend and only work with it.
#[derive(Debug)]
pub struct CudaBackend {
    pub(crate) dev: Device,
    /// Options of forward calls.
    pub opts: CudaOptions,
}

impl CudaBackend {
    /// Opens device `ordinal` with default options: probes (no device → [`CudaError::NoDevice`]),
    /// checks that NVRTC and cuBLAS load, creates the context and stream, and compiles (once
    /// per architecture and process) and loads the kernels.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        Self::with_options(ordinal, CudaOptions::default())
    }

    /// [`CudaBackend::new`] with options.
    pub fn with_options(ordinal: usize, opts: CudaOptions) -> Result<Self, CudaError> {
        Ok(CudaBackend {
            dev: Device::open(ordinal)?,
            opts,
        })
    }

    /// The device this backend runs on.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.dev.info
    }

    /// Opt-in shared memory per block of the device, bytes (bounds the chunk size).
    pub fn shared_memory_per_block(&self) -> usize {
        self.dev.smem_optin
    }

    /// The NVRTC log of the kernel compile (empty when it was clean).
    pub fn compile_log(&self) -> &str {
        &self.dev.kernels.log
    }

    /// Waits until all queued work is done; reports any error a kernel hit.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.dev.synchronize()
    }

    /// The chunk size a chunked forward of `cfg` uses on this device with these options.
    pub fn chunk_size(&self, cfg: &KdaConfig) -> Result<usize, CudaError> {
        let dims = LayerDims::new(cfg)?;
        choose_chunk(dims.k, self.dev.smem_optin, self.opts.chunk_size)
    }

    pub(crate) fn check_owner(&self, owner: u64, what: &str) -> Result<(), CudaError> {
        if owner == self.dev.id {
            Ok(())
        } else {
            Err(CudaError::Invalid(format!(
                "the {what} buffer belongs to another CudaBackend"
            )))
        }
    }
}
