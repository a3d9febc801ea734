//! One opened device: context, the one stream all work goes to, the cuBLAS handle, the loaded
//! kernels and the limits the planner needs. Opening goes through [`crate::probe`] first, so a
//! machine without a GPU gets [`CudaError::NoDevice`] and never reaches a panicking cudarc call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use crate::error::CudaError;
use crate::libs::{self, CudaLibrary};
use crate::module_cache::{self, Kernels};
use crate::nvrtc;
use crate::probe::{guarded, library_message, probe, DeviceInfo};

/// An opened device.
#[derive(Debug)]
pub(crate) struct Device {
    /// What the probe reported.
    pub info: DeviceInfo,
    /// Distinguishes the buffers of one backend from another's (same device or not).
    pub id: u64,
    /// Every copy, kernel and GEMM of this backend runs on this stream, in order.
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub kernels: Arc<Kernels>,
    /// Opt-in maximum of shared memory per block, bytes.
    pub smem_optin: usize,
}

fn blas_available() -> Result<(), CudaError> {
    let max_major = crate::probe::driver_cuda_major();
    libs::prepare(CudaLibrary::Cublas, max_major);
    // SAFETY: `is_culib_present` only tries to dlopen the candidate file names and closes them.
    let present = guarded(
        || Ok(unsafe { cudarc::cublas::sys::is_culib_present() }),
        |m| CudaError::Blas(library_message(&m, "cuBLAS")),
    )?;
    if present {
        Ok(())
    } else {
        Err(CudaError::Blas(libs::unavailable_message(
            CudaLibrary::Cublas,
            max_major,
        )))
    }
}

impl Device {
    /// Opens device `ordinal`: probe, library checks, context, stream, cuBLAS, kernels.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let devices = probe()?;
        let info = devices.get(ordinal).cloned().ok_or_else(|| {
            CudaError::NoDevice(format!(
                "no CUDA device with ordinal {ordinal} ({} present)",
                devices.len()
            ))
        })?;
        nvrtc::available()?;
        blas_available()?;
        guarded(
            || {
                let ctx = CudaContext::new(ordinal)?;
                // SAFETY: every buffer this backend allocates is used only on `stream` below
                // (copies, kernels, and cuBLAS, whose handle is bound to the same stream), so
                // no cross-stream synchronisation is needed and per-buffer events are waste.
                unsafe { ctx.disable_event_tracking() };
                let stream = ctx.new_stream()?;
                let blas = CudaBlas::new(Arc::clone(&stream))?;
                let smem_optin = ctx.attribute(
                    CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                )?;
                let smem_optin = usize::try_from(smem_optin).unwrap_or(0);
                let kernels = module_cache::kernels_for(&ctx, info.compute_capability, smem_optin)?;
                // The stream keeps the context alive.
                Ok(Device {
                    info,
                    id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                    stream,
                    blas,
                    kernels,
                    smem_optin,
                })
            },
            |m| CudaError::Driver(library_message(&m, "CUDA")),
        )
    }

    /// Raw device address of a buffer (for kernel parameter structs and cuBLAS).
    pub fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        // Event tracking is off (see `open`), so the returned guard records nothing.
        let (p, _guard) = s.device_ptr(&self.stream);
        p
    }

    /// Makes the device's context current on the calling thread (cuBLAS calls, unlike kernel
    /// launches and copies, do not do it themselves).
    pub fn bind(&self) -> Result<(), CudaError> {
        self.stream.context().bind_to_thread()?;
        Ok(())
    }

    /// Waits for all work queued on the backend's stream; kernel faults surface here.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream.synchronize()?;
        Ok(())
    }
}
