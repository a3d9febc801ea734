//! Device discovery that never panics, and the panic guard every first contact with a CUDA
//! library goes through.
//!
//! cudarc *panics* when a dynamically loaded library (`libcuda`, `libnvrtc`, `libcublas`) cannot
//! be opened or lacks a symbol. [`guarded`] runs such calls inside [`std::panic::catch_unwind`],
//! with the panic hook silenced for the calling thread only, and turns the panic into an error.

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;

use cudarc::driver::{result, sys};

use crate::error::CudaError;
use crate::libs::{self, CudaLibrary};

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
/// cheap and return the same answer. Discovery creates no CUDA context and allocates no device
/// memory (`cuInit`, `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetName`,
/// `cuDeviceGetAttribute`, `cuDeviceTotalMem` only).
pub fn probe() -> Result<Vec<DeviceInfo>, CudaError> {
    static PROBE: OnceLock<Result<Vec<DeviceInfo>, CudaError>> = OnceLock::new();
    PROBE
        .get_or_init(|| guarded(probe_uncached, no_device_from_panic))
        .clone()
}

/// Whether at least one CUDA device is usable, i.e. `probe().is_ok()`.
pub fn is_available() -> bool {
    probe().is_ok()
}

type PanicHook = Box<dyn Fn(&PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Runs `f` under `catch_unwind`, silencing the panic message of the calling thread (only)
/// while it runs; a panic becomes `on_panic(message)`.
///
/// Calls are serialised process-wide (the panic hook is global state), and a nested call on the
/// same thread only adds a `catch_unwind` (the outer call already silenced the hook).
pub(crate) fn guarded<T>(
    f: impl FnOnce() -> Result<T, CudaError>,
    on_panic: fn(String) -> CudaError,
) -> Result<T, CudaError> {
    static LOCK: Mutex<()> = Mutex::new(());
    thread_local!(static DEPTH: Cell<usize> = const { Cell::new(0) });

    // `take_hook`/`set_hook` panic when called while this thread is already panicking (e.g.
    // from a `Drop` during unwinding); then, and when nested, run without touching the hook.
    let swap_hook = !thread::panicking() && DEPTH.with(Cell::get) == 0;
    let _serial = swap_hook.then(|| LOCK.lock().unwrap_or_else(|p| p.into_inner()));
    let previous: Option<Arc<PanicHook>> = if swap_hook {
        let previous = Arc::new(panic::take_hook());
        let forward = Arc::clone(&previous);
        let caller = thread::current().id();
        panic::set_hook(Box::new(move |info| {
            // Other threads' panics still reach the original hook.
            if thread::current().id() != caller {
                forward(info);
            }
        }));
        Some(previous)
    } else {
        None
    };

    DEPTH.with(|d| d.set(d.get() + 1));
    let outcome = panic::catch_unwind(AssertUnwindSafe(f));
    DEPTH.with(|d| d.set(d.get() - 1));

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
        Err(on_panic(message.to_owned()))
    })
}

/// Shortens cudarc's "library not found" panic (it goes on to list ~30 candidate file names).
pub(crate) fn library_message(message: &str, lib: &str) -> String {
    match message.split_once(" - searched for library names") {
        Some((head, _)) => format!(
            "the {lib} library could not be loaded ({head}); is it installed and on the loader path?"
        ),
        None => format!("the {lib} library is unusable: {message}"),
    }
}

fn no_device_from_panic(message: String) -> CudaError {
    let reason = match message.split_once(" - searched for library names") {
        Some(_) => libs::unavailable_message(CudaLibrary::Driver, None),
        None => format!("the CUDA driver library is unusable: {message}"),
    };
    CudaError::NoDevice(reason)
}

/// The CUDA major version the driver supports (`cuDriverGetVersion` / 1000), when a device
/// is present; `None` otherwise. Caps the NVRTC and cuBLAS versions [`crate::libs`] picks.
pub(crate) fn driver_cuda_major() -> Option<u32> {
    static MAJOR: OnceLock<Option<u32>> = OnceLock::new();
    *MAJOR.get_or_init(|| {
        probe().ok()?;
        guarded(
            || {
                let mut version = 0;
                // SAFETY: one valid out-pointer to c_int; the driver is initialised (probe).
                unsafe { sys::cuDriverGetVersion(&mut version) }
                    .result()
                    .map_err(|e| CudaError::Driver(format!("cuDriverGetVersion: {e}")))?;
                Ok(u32::try_from(version / 1000).ok())
            },
            CudaError::Driver,
        )
        .ok()
        .flatten()
    })
}

/// The actual discovery. May panic inside cudarc when `libcuda` is missing.
fn probe_uncached() -> Result<Vec<DeviceInfo>, CudaError> {
    libs::prepare(CudaLibrary::Driver, None);
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
    fn guarded_turns_a_panic_into_the_chosen_error() {
        let r: Result<(), CudaError> = guarded(|| panic!("boom"), CudaError::Nvrtc);
        assert_eq!(r, Err(CudaError::Nvrtc("boom".into())));
        let r = guarded(|| Ok(3), CudaError::Nvrtc);
        assert_eq!(r, Ok(3));
        // Nested: the inner guard catches, the outer sees a value.
        let r = guarded(
            || {
                guarded(
                    || -> Result<(), CudaError> { panic!("inner") },
                    CudaError::Blas,
                )
            },
            CudaError::Nvrtc,
        );
        assert_eq!(r, Err(CudaError::Blas("inner".into())));
    }

    #[test]
    fn library_message_is_shortened() {
        let m = library_message(
            "Unable to dynamically load the \"nvrtc\" shared library - searched for library names: [..]",
            "NVRTC",
        );
        assert!(
            m.starts_with("the NVRTC library could not be loaded"),
            "{m}"
        );
        assert!(!m.contains("searched"));
    }
}
