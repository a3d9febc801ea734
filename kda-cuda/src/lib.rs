//! CUDA backend for Kimi Delta Attention (KDA).
//!
//! # Status
//!
//! * **Compile-checked, not yet run on a GPU.** Every kernel source is compiled by NVRTC 12.8
//!   for `sm_80` and `sm_90` in CI (`.ci/cuda-compile-check.sh` runs `examples/compile_check.rs`;
//!   NVRTC comes from PyPI, no GPU or toolkit needed), and the whole crate builds and its
//!   non-GPU tests pass on CPU-only machines. **No kernel has been executed yet**: the
//!   numerical agreement with the CPU path is designed for but unverified.
//! * `scripts/gpu-check.sh` is the verification to run on a GPU machine: it builds, runs
//!   `cargo test --workspace` with the device present (the GPU tests in `tests/gpu.rs` compare
//!   every kernel path — decode, recurrent and chunked prefill, packed sequences, −1000 gates,
//!   bf16 I/O — with the CPU backend, f32 rel-RMS ≤ 1e-4 and bf16 ≤ 5e-3), and benchmarks
//!   prefill (T = 8192, H = 96, K = 128, bf16; packed variable lengths) and decode (batch 1
//!   and 64) with `examples/bench.rs`.
//! * Without a usable GPU every entry point returns [`CudaError::NoDevice`] (or
//!   [`CudaError::Nvrtc`] / [`CudaError::Blas`] when those libraries are missing); nothing
//!   panics. [`probe`] and [`is_available`] report the devices without creating a context.
//!
//! # Layout
//!
//! | file | holds |
//! |---|---|
//! | `probe.rs` | device discovery, the panic guard around first contact with CUDA libraries |
//! | `device.rs` | one opened device: context, stream, cuBLAS handle, kernels, limits |
//! | `module_cache.rs` | NVRTC compile per architecture, module load per device (and why NVRTC) |
//! | `nvrtc.rs` | the compiler call, options, log and CUBIN retrieval |
//! | `kernels.rs`, `kernels/*.cu` | the embedded CUDA C sources (no `#include` at all) |
//! | `params.rs` | `#[repr(C)]` kernel parameter structs, layout-checked against the sources |
//! | `plan.rs` | pure planning: dims, limits, launch shapes, shared memory, chunk table, workspace |
//! | `gemm.rs` | projections through cuBLAS (`cublasGemmEx`, f32 accumulation) |
//! | `buffers.rs` | [`DeviceRows`], [`DeviceCaches`], [`DeviceWorkspace`] and host↔device copies |
//! | `weights.rs` | [`DeviceWeights`]: upload from [`kda_core::KdaWeights`] |
//! | `backend.rs` | [`CudaBackend`] and its [`kda_core::KdaBackend`] impl: the layer pipeline |
//! | `host.rs` | host-slice helpers and [`conformance_backend`] for the shared test suite |
//!
//! # The kernels
//!
//! The math mirrors kda-core's CPU path and its layouts exactly (recurrent state `[N,H,K,V]`
//! f32 K-first, conv states `[N, H·K, W−1]` oldest first, weights `[out, in]`):
//!
//! * **decode** (`decode.cu`): one fused kernel per layer step and (sequence, head): short-conv
//!   step (state shifted in place), q/k L2 norm, decay gate, β sigmoid, decay → predict →
//!   delta write → read on the device-resident state (one thread per state column, the column
//!   in registers for K ≤ 128), gated RMSNorm. Projections before and after are cuBLAS GEMMs.
//! * **prefill** (`conv.cu`, `gate.cu`, `chunked.cu`, `norm.cu`): conv + SiLU + L2 norm over
//!   packed sequences; the gate; the chunked WY/UT form — per chunk the CPU's compensated
//!   chunk-local cumsum, the 16-row diagonal blocks factorised against their first row when
//!   their decay spread is ≤ 80 and per-pair exponents otherwise, `M = (I − N)⁻¹` by forward
//!   substitution in f32, `w`, `u`, then a sequential pass over each sequence's chunks for the
//!   state and the output. Every exponent is a difference of cumulative sums that is ≤ 0
//!   (except the bounded factorised diagonal), so any gate ≤ 0 — including −1000 — stays
//!   finite. `recurrent.cu` runs the token-by-token form for short sequences.
//! * **I/O formats**: activations f32 or bf16 ([`DeviceRows`]), weights f32 or bf16
//!   ([`WeightFormat`]); the state, the conv states and every intermediate are f32. bf16 GEMMs
//!   accumulate in f32; f32 GEMMs are strict f32 (no TF32).
//!
//! The cudarc features are `std`, `driver`, `nvrtc`, `cublas`, `dynamic-loading` and
//! `cuda-12080` ([`CUDA_VERSION_FEATURE`]): nothing CUDA-related is linked at build time;
//! `libcuda`, `libnvrtc` and `libcublas` are opened at run time.
//!
//! # Example
//!
//! ```no_run
//! use kda_cuda::{CudaBackend, CudaError};
//! match CudaBackend::new(0) {
//!     Ok(be) => println!("running on {}", be.device_info().name),
//!     Err(CudaError::NoDevice(why)) => println!("skipped: no CUDA device ({why})"),
//!     Err(e) => println!("CUDA unusable: {e}"),
//! }
//! ```

#![deny(missing_docs)]

mod backend;
mod buffers;
mod device;
mod error;
mod gemm;
pub mod kernels;
mod launch;
mod module_cache;
pub mod nvrtc;
mod params;
pub mod plan;
mod probe;
mod host;
mod weights;

pub use backend::{CudaBackend, CudaOptions};
pub use buffers::{DeviceCaches, DeviceRows, DeviceWorkspace};
pub use error::CudaError;
pub use host::{conformance_backend, HostFormats};
pub use plan::Dtype;
pub use probe::{is_available, probe, DeviceInfo};
pub use weights::{DeviceWeights, WeightFormat};

/// The cudarc feature that pins the CUDA driver-API bindings this crate is built against
/// (`cuda-12080`, i.e. CUDA 12.8).
pub const CUDA_VERSION_FEATURE: &str = "cuda-12080";

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
