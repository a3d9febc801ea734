//! Native work called from Python: panics turned into exceptions, the GIL released around the
//! computation, and its time recorded for `last_compute_ns`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::delta::{self, Dims, Flags, Inputs, Outputs};
use crate::threads;

/// Runs `f`, turning a panic into a `RuntimeError` (no Rust panic reaches Python).
pub(crate) fn no_panic<T>(f: impl FnOnce() -> Result<T, String>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(PyValueError::new_err(e)),
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(PyRuntimeError::new_err(format!(
                "internal error in kda (please report): {what}"
            )))
        }
    }
}

/// Nanoseconds the last `delta_rule` / `fla_forward` call spent computing.
static LAST_COMPUTE_NS: AtomicU64 = AtomicU64::new(0);

/// Runs [`delta::run`] with the GIL released on a pool of `threads`, and records its time.
pub(crate) fn compute(
    py: Python<'_>,
    dims: &Dims,
    x: &Inputs<'_>,
    flags: &Flags,
    out: Outputs<'_>,
    threads: usize,
) -> PyResult<u64> {
    let ns = py.detach(|| {
        no_panic(|| {
            let t0 = std::time::Instant::now();
            threads::install(threads, || delta::run(dims, x, flags, out, threads))?;
            Ok(t0.elapsed().as_nanos() as u64)
        })
    })?;
    LAST_COMPUTE_NS.store(ns, Ordering::Relaxed);
    Ok(ns)
}

/// Nanoseconds the last `chunk_kda` / `fused_recurrent_kda` call spent computing (the
/// GIL-free part: [`delta::run`]).
#[pyfunction]
pub(crate) fn last_compute_ns() -> u64 {
    LAST_COMPUTE_NS.load(Ordering::Relaxed)
}
