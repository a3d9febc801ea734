//! The crate's error type.

/// Errors of the CUDA backend. Every argument problem is reported as a value; nothing in the
/// public API panics on bad input.
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
    /// NVRTC (the run-time CUDA compiler) is missing, or a kernel failed to compile (the string
    /// holds the compiler log).
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    /// cuBLAS is missing or a cuBLAS call failed.
    #[error("cuBLAS: {0}")]
    Blas(String),
    /// A valid configuration that these kernels do not support (e.g. shared memory too small
    /// for the head dim on this device). The string says what and why.
    #[error("unsupported by the CUDA kernels: {0}")]
    Unsupported(String),
    /// A device buffer does not fit the call (wrong dtype, another device, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

impl From<cudarc::cublas::result::CublasError> for CudaError {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        CudaError::Blas(format!("{e:?}"))
    }
}
