//! The compiled kernels, cached: one NVRTC compile per GPU architecture per process, one
//! module load per device.
//!
//! **Why NVRTC at run time rather than offline PTX.** The build then needs no CUDA toolkit
//! (`nvcc`) at all — the crate builds and tests on CPU-only machines and CI, and a release
//! binary carries only the CUDA C text. Each device gets code for its exact architecture
//! (`--gpu-architecture=sm_XY`, loaded as a CUBIN, so the driver does not need to JIT PTX and
//! an older driver that cannot read the newer NVRTC's PTX ISA still loads the binary), and a
//! future specialisation (e.g. compiling the head dim in as a constant) is a compile option
//! rather than a build-matrix entry. The cost is one compile per architecture per process
//! (about 10 s of CPU time for the whole module; measured by `.ci/cuda-compile-check.sh`),
//! paid on the first [`crate::CudaBackend::new`] of each architecture, and `libnvrtc` must be
//! present at run time. CI compiles every file for sm_80 and sm_90 with NVRTC 12.8 and for
//! sm_90 and sm_100 with NVRTC 13.0 (`examples/compile_check.rs`), so a syntax or resource
//! error cannot reach a GPU machine.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::error::CudaError;
use crate::kernels;
use crate::nvrtc;
use crate::plan::CHUNK_STATIC_SMEM;

/// The module's kernels, loaded in one device's context.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub gate: CudaFunction,
    pub conv_prefill: CudaFunction,
    pub conv_state_update: CudaFunction,
    pub gated_norm: CudaFunction,
    pub recurrent: CudaFunction,
    pub decode: CudaFunction,
    pub chunk_intra: CudaFunction,
    pub chunk_state: CudaFunction,
    pub cast_to_bf16: CudaFunction,
    pub cast_to_f32: CudaFunction,
    /// The NVRTC log of the compile (warnings; empty when clean).
    pub log: String,
    _module: Arc<CudaModule>,
}

/// NVRTC output for one architecture.
#[derive(Debug)]
struct Binary {
    compiled: nvrtc::Compiled,
}

/// Compiled binaries by compute capability.
type BinaryCache = Mutex<HashMap<(i32, i32), Arc<Binary>>>;
/// Loaded kernels by device ordinal.
type ModuleCache = Mutex<HashMap<usize, Arc<Kernels>>>;

fn binaries() -> &'static BinaryCache {
    static CACHE: OnceLock<BinaryCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

fn modules() -> &'static ModuleCache {
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The NVRTC target for compute capability `cc`.
pub(crate) fn arch_for(cc: (i32, i32)) -> String {
    format!("sm_{}{}", cc.0, cc.1)
}

fn binary_for(cc: (i32, i32)) -> Result<Arc<Binary>, CudaError> {
    let mut cache = binaries().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = cache.get(&cc) {
        return Ok(Arc::clone(b));
    }
    let compiled = nvrtc::compile(&kernels::module_source(), "kda.cu", &arch_for(cc), &[])?;
    let b = Arc::new(Binary { compiled });
    cache.insert(cc, Arc::clone(&b));
    Ok(b)
}

/// The kernels for device `ordinal` (compute capability `cc`, opt-in shared memory per block
/// `smem_optin` bytes), compiling and loading them on first use.
pub(crate) fn kernels_for(
    ctx: &Arc<CudaContext>,
    cc: (i32, i32),
    smem_optin: usize,
) -> Result<Arc<Kernels>, CudaError> {
    let ordinal = ctx.ordinal();
    if let Some(k) = modules()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&ordinal)
    {
        return Ok(Arc::clone(k));
    }
    let bin = binary_for(cc)?;
    let image = match &bin.compiled.cubin {
        Some(cubin) => Ptx::from_binary(cubin.clone()),
        None => Ptx::from_src(bin.compiled.ptx.clone()),
    };
    let module = ctx.load_module(image)?;
    let f = |name: &str| -> Result<CudaFunction, CudaError> {
        module
            .load_function(name)
            .map_err(|e| CudaError::Driver(format!("kernel {name}: {e}")))
    };
    let k = Kernels {
        gate: f("kda_gate")?,
        conv_prefill: f("kda_conv_prefill")?,
        conv_state_update: f("kda_conv_state_update")?,
        gated_norm: f("kda_gated_norm")?,
        recurrent: f("kda_recurrent")?,
        decode: f("kda_decode")?,
        chunk_intra: f("kda_chunk_intra")?,
        chunk_state: f("kda_chunk_state")?,
        cast_to_bf16: f("kda_cast_f32_to_bf16")?,
        cast_to_f32: f("kda_cast_bf16_to_f32")?,
        log: bin.compiled.log.clone(),
        _module: Arc::clone(&module),
    };
    // Let the kernels with dynamic shared memory use the device's opt-in maximum (the default
    // cap is 48 KiB); each launch still asks only for what its shape needs.
    let dynamic = smem_optin.saturating_sub(CHUNK_STATIC_SMEM);
    let dynamic = i32::try_from(dynamic).unwrap_or(i32::MAX);
    for func in [&k.recurrent, &k.decode, &k.chunk_intra, &k.chunk_state] {
        func.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            dynamic,
        )?;
    }
    let k = Arc::new(k);
    modules()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(ordinal, Arc::clone(&k));
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        assert_eq!(arch_for((9, 0)), "sm_90");
        assert_eq!(arch_for((8, 6)), "sm_86");
        assert_eq!(arch_for((12, 0)), "sm_120");
    }
}
