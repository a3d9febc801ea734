//! Host-side helpers: run a layer on the GPU from host slices, with the CPU backend's argument
//! types. This is the hook the conformance suite (and anyone comparing against the CPU) uses:
//! the same `KdaWeights`, `CachesMut` and `&[f32]` rows go in, the same come out.
//!
//! Each call uploads the weights and caches, runs, downloads, and synchronises, so it is for
//! tests and tools, not for serving (keep [`DeviceWeights`], [`DeviceCaches`] and a
//! [`DeviceWorkspace`] on the device and call [`kda_core::KdaBackend`] directly for that).

use kda_core::{Batch, CachesMut, InitialCaches, KdaBackend, KdaConfig, KdaWeights};

use crate::buffers::{DeviceCaches, DeviceRows, DeviceWorkspace};
use crate::error::CudaError;
use crate::handle::CudaBackend;
use crate::plan::{self, Dtype};
use crate::weights::{DeviceWeights, WeightFormat};

/// Formats a host call uses on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFormats {
    /// Weight matrices.
    pub weights: WeightFormat,
    /// Input and output rows.
    pub io: Dtype,
}

impl HostFormats {
    /// f32 weights and f32 rows: the reference-matching configuration (rel-RMS ≲ 1e-5 expected
    /// against the CPU path; f32 GEMMs, no TF32).
    pub const F32: HostFormats = HostFormats {
        weights: WeightFormat::F32,
        io: Dtype::F32,
    };
    /// bf16 weights and bf16 rows with f32 state and f32 internals: the production path.
    pub const BF16: HostFormats = HostFormats {
        weights: WeightFormat::Bf16,
        io: Dtype::Bf16,
    };
}

/// A backend on device 0 for the conformance suite: `Err(CudaError::NoDevice(..))` (never a
/// panic) on machines without a usable GPU, so callers can print `skipped: ...` and go on.
pub fn conformance_backend() -> Result<CudaBackend, CudaError> {
    CudaBackend::new(0)
}

impl CudaBackend {
    /// [`kda_core::KdaLayer::forward`]'s contract on the GPU, from and to host memory, in
    /// [`HostFormats::F32`]: `batch` as the CPU layer takes it (`x`, `out` `[T, hidden]`,
    /// `cu_seqlens` `[N+1]`), `caches` the N sequences' caches (read when `init` is `Given`,
    /// always left holding the final caches).
    pub fn forward_host(
        &mut self,
        cfg: &KdaConfig,
        weights: &KdaWeights<'_>,
        batch: Batch<'_>,
        caches: CachesMut<'_>,
        init: InitialCaches,
    ) -> Result<(), CudaError> {
        self.forward_host_with(cfg, weights, batch, caches, init, HostFormats::F32)
    }

    /// [`CudaBackend::forward_host`] with chosen device formats.
    pub fn forward_host_with(
        &mut self,
        cfg: &KdaConfig,
        weights: &KdaWeights<'_>,
        batch: Batch<'_>,
        mut caches: CachesMut<'_>,
        init: InitialCaches,
        formats: HostFormats,
    ) -> Result<(), CudaError> {
        let Batch { x, cu_seqlens, out } = batch;
        weights.validate(cfg)?;
        let shape = plan::forward_shape(cfg, x.len(), out.len(), cu_seqlens)?;
        let (t, n) = (shape.tokens, shape.seqs);
        caches.validate(cfg, n)?;
        let w = DeviceWeights::upload(self, cfg, weights, formats.weights)?;
        let xd = DeviceRows::from_f32(self, x, formats.io)?;
        let mut od = DeviceRows::zeros(self, formats.io, out.len())?;
        let mut cd = DeviceCaches::from_host(self, cfg, &caches)?;
        let mut ws = DeviceWorkspace::new(self, self.forward_workspace_len(cfg, t)?)?;
        self.forward(cfg, &w, &xd, cu_seqlens, &mut cd, init, &mut od, &mut ws)?;
        self.synchronize()?;
        out.copy_from_slice(&od.to_f32(self)?);
        cd.download(self, &mut caches)
    }

    /// [`kda_core::KdaLayer::decode_step`]'s contract on the GPU, from and to host memory, in
    /// [`HostFormats::F32`]: one token per sequence, `x`, `out` `[N, hidden]`, caches of N
    /// sequences updated in place.
    pub fn decode_host(
        &mut self,
        cfg: &KdaConfig,
        weights: &KdaWeights<'_>,
        x: &[f32],
        caches: CachesMut<'_>,
        out: &mut [f32],
    ) -> Result<(), CudaError> {
        self.decode_host_with(cfg, weights, x, caches, out, HostFormats::F32)
    }

    /// [`CudaBackend::decode_host`] with chosen device formats.
    pub fn decode_host_with(
        &mut self,
        cfg: &KdaConfig,
        weights: &KdaWeights<'_>,
        x: &[f32],
        mut caches: CachesMut<'_>,
        out: &mut [f32],
        formats: HostFormats,
    ) -> Result<(), CudaError> {
        weights.validate(cfg)?;
        let n = plan::decode_shape(cfg, x.len(), out.len())?.seqs;
        caches.validate(cfg, n)?;
        let w = DeviceWeights::upload(self, cfg, weights, formats.weights)?;
        let xd = DeviceRows::from_f32(self, x, formats.io)?;
        let mut od = DeviceRows::zeros(self, formats.io, out.len())?;
        let mut cd = DeviceCaches::from_host(self, cfg, &caches)?;
        let mut ws = DeviceWorkspace::new(self, self.decode_workspace_len(cfg, n)?)?;
        self.decode_step(cfg, &w, &xd, &mut cd, &mut od, &mut ws)?;
        self.synchronize()?;
        out.copy_from_slice(&od.to_f32(self)?);
        cd.download(self, &mut caches)
    }
}
