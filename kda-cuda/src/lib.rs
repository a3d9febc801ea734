//! CUDA backend for Kimi Delta Attention (KDA).
//!
//! # Status
//!
//! In a later issue this crate will implement [`kda_core::KdaBackend`] with CUDA kernels (the
//! single-token decode step and the chunked prefill). **Today it only provides device
//! discovery**: [`probe`] lists the CUDA devices visible to the driver, and [`is_available`]
//! says whether there is at least one. The conformance suite calls [`probe`] and prints
//! `skipped: no CUDA device` for its GPU cases on machines without a GPU, so the whole
//! workspace builds and tests on CPU-only machines and CI.
//!
//! # How CUDA is reached
//!
//! The crate uses [`cudarc`] 0.19 with the features `std`, `driver`, `nvrtc`,
//! `dynamic-loading` and `cuda-12080` (see [`CUDA_VERSION_FEATURE`]):
//!
//! * `dynamic-loading` means nothing CUDA-related is linked at build time; `libcuda` is opened
//!   with `dlopen` on the first driver call. Building therefore needs neither a CUDA toolkit
//!   nor a driver.
//! * `cuda-12080` pins the generated bindings to the CUDA 12.8 driver API. A driver that
//!   supports CUDA 12.8 or newer is needed at run time to use the full binding set; device
//!   discovery only uses entry points that have existed since CUDA 3.x.
//!
//! cudarc *panics* when `libcuda` cannot be loaded (or lacks a symbol). [`probe`] runs the
//! first driver calls inside [`std::panic::catch_unwind`], with the panic hook temporarily
//! silenced for the probing thread, and turns such a panic into [`CudaError::NoDevice`]. The
//! probe runs once per process; its result is cached.
//!
//! Discovery does not create a CUDA context: it only uses `cuInit`, `cuDeviceGetCount`,
//! `cuDeviceGet`, `cuDeviceGetName`, `cuDeviceGetAttribute` and `cuDeviceTotalMem`, so it
//! allocates no device memory.

#![deny(missing_docs)]

use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::{Arc, OnceLock};
use std::thread;

use cudarc::driver::{result, sys};

/// The cudarc feature that pins the CUDA driver-API bindings this crate is built against
/// (`cuda-12080`, i.e. CUDA 12.8).
pub const CUDA_VERSION_FEATURE: &str = "cuda-12080";

/// Errors of the CUDA backend.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    /// No usable CUDA device: the driver library is missing, the driver failed to initialise,
    /// or it reports zero devices. The string says which.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA driver call failed after the driver was successfully initialised.
    #[error("CUDA driver error: {0}")]
    Driver(String),
    /// An error from the portable core (shape, length or configuration checks).
    #[error(transparent)]
    Core(#[from] kda_core::KdaError),
}

/// Static facts about one CUDA device, as reported by the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal, as used by `cuDeviceGet` / `CUDA_VISIBLE_DEVICES` order.
    pub ordinal: usize,
    /// Marketing name of the device (e.g. `"NVIDIA H100 80GB HBM3"`).
    pub name: String,
    /// Compute capability as `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub compute_capability: (i32, i32),
    /// Total device memory in bytes.
    pub total_memory_bytes: usize,
}

/// Lists the CUDA devices visible to the driver.
///
/// Returns [`CudaError::NoDevice`] with the reason when the CUDA driver library cannot be
/// loaded, when `cuInit` fails, or when the driver reports zero devices; returns
/// [`CudaError::Driver`] when a per-device query fails afterwards.
///
/// Never panics. The probe runs once per process and its result is cached, so later calls are
/// cheap and return the same answer.
pub fn probe() -> Result<Vec<DeviceInfo>, CudaError> {
    static PROBE: OnceLock<Result<Vec<DeviceInfo>, CudaError>> = OnceLock::new();
    PROBE.get_or_init(guarded_probe).clone()
}

/// Whether at least one CUDA device is usable, i.e. `probe().is_ok()`.
pub fn is_available() -> bool {
    probe().is_ok()
}

type PanicHook = Box<dyn Fn(&PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Runs [`probe_uncached`] under `catch_unwind`, silencing the panic message of the probing
/// thread (only) while it runs.
fn guarded_probe() -> Result<Vec<DeviceInfo>, CudaError> {
    // `take_hook`/`set_hook` panic when called while this thread is already panicking (e.g.
    // from a `Drop` during unwinding); in that case probe without touching the hook.
    let swap_hook = !thread::panicking();
    let previous: Option<Arc<PanicHook>> = if swap_hook {
        let previous = Arc::new(panic::take_hook());
        let forward = Arc::clone(&previous);
        let prober = thread::current().id();
        panic::set_hook(Box::new(move |info| {
            // Other threads' panics still reach the original hook.
            if thread::current().id() != prober {
                forward(info);
            }
        }));
        Some(previous)
    } else {
        None
    };

    let outcome = panic::catch_unwind(AssertUnwindSafe(probe_uncached));

    if let Some(previous) = previous {
        // Dropping our hook drops its clone of `previous`, so the original box can usually be
        // reinstated as-is; otherwise forward to it.
        drop(panic::take_hook());
        match Arc::try_unwrap(previous) {
            Ok(original) => panic::set_hook(original),
            Err(shared) => panic::set_hook(Box::new(move |info| shared(info))),
        }
    }

    outcome.unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic payload");
        // cudarc's "library not found" message goes on to list ~30 candidate file names;
        // keep only its head. Any other panic (e.g. "Missing symbol ..." from a driver too
        // old for the bindings) is reported as is.
        let reason = match message.split_once(" - searched for library names") {
            Some((head, _)) => format!(
                "the CUDA driver library could not be loaded ({head}); \
                 is the NVIDIA driver installed and libcuda.so on the loader path?"
            ),
            None => format!("the CUDA driver library is unusable: {message}"),
        };
        Err(CudaError::NoDevice(reason))
    })
}

/// The actual discovery. May panic inside cudarc when `libcuda` is missing.
fn probe_uncached() -> Result<Vec<DeviceInfo>, CudaError> {
    result::init().map_err(|e| CudaError::NoDevice(format!("cuInit failed: {e}")))?;
    let count = result::device::get_count()
        .map_err(|e| CudaError::NoDevice(format!("cuDeviceGetCount failed: {e}")))?;
    if count <= 0 {
        return Err(CudaError::NoDevice(
            "the CUDA driver reports zero devices".to_owned(),
        ));
    }
    (0..count).map(device_info).collect()
}

fn device_info(ordinal: i32) -> Result<DeviceInfo, CudaError> {
    let driver = |what: &'static str| {
        move |e: result::DriverError| CudaError::Driver(format!("{what} (device {ordinal}): {e}"))
    };
    let dev = result::device::get(ordinal).map_err(driver("cuDeviceGet"))?;
    let name = result::device::get_name(dev).map_err(driver("cuDeviceGetName"))?;
    // SAFETY: `dev` was returned by `cuDeviceGet` above, after a successful `cuInit`.
    let (major, minor, total_memory_bytes) = unsafe {
        let attr = |a| result::device::get_attribute(dev, a);
        let major = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
            .map_err(driver("cuDeviceGetAttribute(major)"))?;
        let minor = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
            .map_err(driver("cuDeviceGetAttribute(minor)"))?;
        let total = result::device::total_mem(dev).map_err(driver("cuDeviceTotalMem"))?;
        (major, minor, total)
    };
    Ok(DeviceInfo {
        ordinal: usize::try_from(ordinal).unwrap_or_default(),
        name,
        compute_capability: (major, minor),
        total_memory_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_display() {
        let e = CudaError::NoDevice("x".into());
        assert_eq!(e.to_string(), "no CUDA device: x");
    }

    #[test]
    fn core_error_converts() {
        let core = kda_core::KdaError::Length {
            arg: "q",
            expected: 4,
            actual: 3,
        };
        let e: CudaError = core.into();
        assert_eq!(e, CudaError::Core(core));
        assert_eq!(e.to_string(), core.to_string());
    }
}
