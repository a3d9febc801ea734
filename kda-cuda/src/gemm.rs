//! Projections through cuBLAS: `out[t, :] = x[t, :] · Wᵀ` for row-major `x` and checkpoint-layout
//! `W` `[out, in]`, with f32 accumulation (`CUBLAS_COMPUTE_32F`: strict f32 for f32 operands —
//! no TF32 — and bf16 tensor-core GEMMs with f32 accumulation for bf16 operands).

use std::ffi::{c_int, c_void};

use cudarc::cublas::{result, sys, CudaBlas};

use crate::error::CudaError;
use crate::plan::{to_i32, Dtype};

/// A strided row-major operand: device address, format, row stride in elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Act {
    pub ptr: u64,
    pub dtype: Dtype,
    pub ld: usize,
}

fn cuda_type(d: Dtype) -> sys::cudaDataType {
    match d {
        Dtype::F32 => sys::cudaDataType::CUDA_R_32F,
        Dtype::Bf16 => sys::cudaDataType::CUDA_R_16BF,
    }
}

/// A weight matrix `[rows, cols]` row-major (checkpoint layout), contiguous.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat {
    pub ptr: u64,
    pub dtype: Dtype,
    pub rows: usize,
    pub cols: usize,
}

fn c(what: &str, v: usize) -> Result<c_int, CudaError> {
    to_i32(what, v)
}

/// `out[t, 0..w.rows] = x[t, 0..w.cols] · Wᵀ` for `t < rows`.
///
/// `x` must be in the weights' format; `out` must be f32, or bf16 with bf16 weights (the
/// combinations cuBLAS supports with `CUBLAS_COMPUTE_32F`).
///
/// # Safety
/// `w` must address a live `[w.rows, w.cols]` matrix, `x` `rows` rows of at least `w.cols`
/// elements with stride `x.ld`, and `out` `rows` rows of at least `w.rows` elements with stride
/// `out.ld`, all device memory of the context whose stream `blas` is bound to, `out` not
/// overlapping `x` or `w`.
pub(crate) unsafe fn linear(
    blas: &CudaBlas,
    rows: usize,
    x: Act,
    w: Mat,
    out: Act,
) -> Result<(), CudaError> {
    if rows == 0 || w.rows == 0 {
        return Ok(());
    }
    let ok = x.dtype == w.dtype && (out.dtype == Dtype::F32 || w.dtype == Dtype::Bf16);
    if !ok || x.ld < w.cols || out.ld < w.rows {
        return Err(CudaError::Invalid(format!(
            "GEMM operands: x {:?} ld {}, weights {:?} [{}, {}], out {:?} ld {}",
            x.dtype, x.ld, w.dtype, w.rows, w.cols, out.dtype, out.ld
        )));
    }
    // Column-major view: C[n_out, rows] = op(A)·B with A = W (stored [cols, n_out] col-major,
    // transposed by CUBLAS_OP_T) and B = xᵀ ([cols, rows] col-major, ld = x.ld).
    let (m, n, k) = (
        c("GEMM m", w.rows)?,
        c("GEMM n", rows)?,
        c("GEMM k", w.cols)?,
    );
    let (lda, ldb, ldc) = (
        c("GEMM lda", w.cols)?,
        c("GEMM ldb", x.ld)?,
        c("GEMM ldc", out.ld)?,
    );
    let alpha = 1.0f32;
    let beta = 0.0f32;
    // SAFETY: the caller guarantees the operand extents (checked above against the strides);
    // alpha/beta are host f32 scalars, as CUBLAS_COMPUTE_32F with the default host pointer
    // mode expects; the type combination is one cublasGemmEx supports (checked above).
    unsafe {
        result::gemm_ex(
            *blas.handle(),
            sys::cublasOperation_t::CUBLAS_OP_T,
            sys::cublasOperation_t::CUBLAS_OP_N,
            m,
            n,
            k,
            (&alpha) as *const f32 as *const c_void,
            w.ptr as *const c_void,
            cuda_type(w.dtype),
            lda,
            x.ptr as *const c_void,
            cuda_type(x.dtype),
            ldb,
            (&beta) as *const f32 as *const c_void,
            out.ptr as *mut c_void,
            cuda_type(out.dtype),
            ldc,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }?;
    Ok(())
}
