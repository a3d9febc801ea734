//! Submitting one kernel with its parameter struct.

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};

use crate::device::Device;
use crate::error::CudaError;
use crate::plan::Launch;

/// Queues `func<<<l.grid, l.block, l.smem>>>(params)` on the device's stream.
///
/// # Safety
/// `P` must be the parameter struct `func` takes (see `params.rs`), and every device address
/// in `params` must point to live memory of this device that is large enough for the extents
/// the kernel derives from `params` and `l` (the callers size them with `plan.rs`).
pub(crate) unsafe fn launch<P: DeviceRepr>(
    dev: &Device,
    func: &CudaFunction,
    l: Launch,
    params: &P,
) -> Result<(), CudaError> {
    let cfg = LaunchConfig {
        grid_dim: l.grid,
        block_dim: (l.block, 1, 1),
        shared_mem_bytes: l.smem,
    };
    let mut args = dev.stream.launch_builder(func);
    args.arg(params);
    // SAFETY: the caller's contract covers the parameter type and the memory it addresses;
    // `params` outlives the call (the driver copies kernel parameters at launch).
    unsafe { args.launch(cfg) }?;
    Ok(())
}
