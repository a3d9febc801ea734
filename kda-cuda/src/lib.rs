//! CUDA backend for Kimi Delta Attention (KDA).
//!
//! # Status
//!
//! * **Run on an H200 (2026-12-04, commit ea86e6e): correct, and slower than fla's Triton
//!   kernels.** `scripts/gpu-check.sh` (built on a machine with cargo by `--build-only`, run on
//!   the GPU machine with no Rust there) passed every step in 28 s: the kernels compiled with
//!   the device's NVRTC 13.0 for `sm_90`, `tests/gpu.rs` compared every path through the public
//!   API (cuBLAS projections included) with the CPU backend (f32 ≤ 1e-4, bf16 I/O ≤ 5e-3 on
//!   outputs and all caches, chunk-size independence, device-resident prefill → decode through
//!   [`kda_core::KdaBackend`], argument errors), and every fla fixture ran on the device: worst
//!   rel-RMS 7.4e-7 against fla and against the CPU backend. Speed (the table is in
//!   `PERFORMANCE.md`, 2026-12-04, H200, ea86e6e): prefill T = 8192, H = 96, K = 128 in
//!   38.8 ms for the delta-rule core against fla's `chunk_kda` at 3.17 ms on the same GPU; decode at 52 %
//!   (batch 1) and 39 % (batch 64) of the HBM datasheet bandwidth for the state and weight bytes.
//! * **Compile-checked in CI for sm_80, sm_90 and sm_100.** CI compiles every kernel source with
//!   NVRTC 12.8 for `sm_80` and `sm_90` and with NVRTC 13.0 for `sm_90` and `sm_100` (both from
//!   PyPI; no GPU, no CUDA toolkit), failing on any error, warning, missing entry point or
//!   register spill (`.ci/cuda-compile-check.sh` → `examples/compile_check.rs`). The crate
//!   builds and its non-GPU tests pass on CPU-only machines.
//! * **Kernel logic checked on the CPU, in an emulator.** `tests/emulated.rs` runs the very same
//!   `.cu` sources in a small SIMT emulator (`tests/emulator/`: one OS thread per CUDA thread,
//!   real barriers and warp shuffles, NaN-poisoned shared memory) against a float64 reference of
//!   the math: conv + L2 norm, gate, chunked and token-by-token delta rule (packed sequences,
//!   empty and 1-token sequences, partial chunks, hard-reset gates, the register and the
//!   global-memory state paths), gated norm, conv/recurrent state updates and the fused decode
//!   step all agree to ≈ 3e-7 rel-RMS. This exercises indexing, algorithms and barrier
//!   placement, so kernel changes can be checked between GPU runs; it says nothing about the
//!   driver, cuBLAS, register/occupancy limits or speed.
//! * Without a usable GPU every entry point returns [`CudaError::NoDevice`] (or
//!   [`CudaError::Nvrtc`] / [`CudaError::Blas`] when those libraries are missing); nothing
//!   panics. [`probe`] and [`is_available`] report the devices without creating a context.
//!
//! # Layout
//!
//! | file | holds |
//! |---|---|
//! | `libs.rs` | finding libcuda / libnvrtc / libcublas (CUDA 13 or 12) before cudarc opens them |
//! | `probe.rs` | device discovery, the panic guard around first contact with CUDA libraries |
//! | `device.rs` | one opened device: context, stream, cuBLAS handle, kernels, limits |
//! | `module_cache.rs` | NVRTC compile per architecture, module load per device (and why NVRTC) |
//! | `nvrtc.rs` | the compiler call, options, log and CUBIN retrieval |
//! | `kernels.rs`, `kernels/*.cu` | the embedded CUDA C sources (no `#include` at all) |
//! | `params.rs` | `#[repr(C)]` kernel parameter structs, layout-checked against the sources |
//! | `plan.rs` | pure planning: dims, limits, launch shapes, shared memory, chunk table, workspace |
//! | `gemm.rs` | projections through cuBLAS (`cublasGemmEx`, f32 accumulation) |
//! | `handle.rs` | [`CudaBackend`] itself: the opened device and the options (what buffers and weights are made through) |
//! | `buffers.rs` | [`DeviceRows`], [`DeviceCaches`], [`DeviceWorkspace`] and host↔device copies |
//! | `weights.rs` | [`DeviceWeights`]: upload from [`kda_core::KdaWeights`] |
//! | `backend.rs` | [`CudaBackend`]'s calls and its [`kda_core::KdaBackend`] impl: the layer pipeline |
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
//! # CUDA 12 and CUDA 13: one binary
//!
//! The cudarc features are `std`, `driver`, `nvrtc`, `cublas`, `dynamic-loading` and
//! `cuda-13000` ([`CUDA_VERSION_FEATURE`]): nothing CUDA-related is linked at build time;
//! `libcuda`, `libnvrtc` and `libcublas` are opened at run time. The same binary runs with the
//! CUDA 13 libraries (`libnvrtc.so.13`, `libcublas.so.13`, driver 580+) and with CUDA 12 ones:
//!
//! * cudarc's names for a library depend on the binding set: with `cuda-12080` they stop at
//!   `.so.12`, with `cuda-13000` they are `.so.13` and then `.so.12`. cudarc offers no choice of
//!   binding set at run time (`cuda-version-from-build-system` picks it when building, from the
//!   toolkit found then), so the CUDA 13.0 bindings it is.
//! * Those bindings also name a few driver entry points that only CUDA 13 drivers export. None
//!   of them is reached: every driver, NVRTC and cuBLAS symbol the crate's tests and bench
//!   resolve also exists in the CUDA 12.0 bindings (`scripts/cuda12-symbols.sh` reads them off
//!   the built executables; CI runs it), so a CUDA 12 driver serves them.
//! * [`libs`] finds the libraries in places the loader does not search — a Python
//!   environment's `site-packages/nvidia/*/lib` (the `nvidia-*` wheels: `nvidia/cu13/lib` for
//!   CUDA 13, `nvidia/cuda_nvrtc/lib` and `nvidia/cublas/lib` for CUDA 12), `CUDA_HOME`, the
//!   driver's `/usr/local/nvidia/lib64`, `KDA_CUDA_LIB_DIR` — and opens the chosen file by full
//!   path, so cudarc's later open by soname gets it. NVRTC and cuBLAS are never newer than the
//!   driver's CUDA major version (a CUBIN from NVRTC 13 would not load on a CUDA 12 driver).
//!   When nothing is found, the error names every folder searched.
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
mod handle;
mod host;
pub mod kernels;
mod launch;
pub mod libs;
mod module_cache;
pub mod nvrtc;
mod params;
pub mod plan;
mod probe;
mod weights;

pub use buffers::{DeviceCaches, DeviceRows, DeviceWorkspace};
pub use error::CudaError;
pub use handle::{CudaBackend, CudaOptions};
pub use host::{conformance_backend, HostFormats};
pub use plan::Dtype;
pub use probe::{is_available, probe, DeviceInfo};
pub use weights::{DeviceWeights, WeightFormat};

/// The cudarc feature that pins the CUDA API bindings this crate is built against
/// (`cuda-13000`, i.e. CUDA 13.0; the libraries of CUDA 13 and 12 both load, see the crate
/// documentation).
pub const CUDA_VERSION_FEATURE: &str = "cuda-13000";

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
