//! What the native code uses of numpy, looked up once per process.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// What the native code needs of numpy, looked up once.
pub(crate) struct NumpyApi {
    /// `numpy.ndarray`.
    pub(crate) ndarray: Py<PyType>,
    /// `numpy.float32`.
    pub(crate) float32: Py<PyAny>,
    /// `numpy.empty`.
    pub(crate) empty: Py<PyAny>,
    /// `numpy.asarray`.
    pub(crate) asarray: Py<PyAny>,
}

static NUMPY: PyOnceLock<NumpyApi> = PyOnceLock::new();

/// numpy's API, imported on first use.
pub(crate) fn numpy_api(py: Python<'_>) -> PyResult<&'static NumpyApi> {
    NUMPY.get_or_try_init(py, || {
        let m = py.import("numpy")?;
        Ok(NumpyApi {
            ndarray: m.getattr("ndarray")?.cast_into::<PyType>()?.unbind(),
            float32: m.getattr("float32")?.unbind(),
            empty: m.getattr("empty")?.unbind(),
            asarray: m.getattr("asarray")?.unbind(),
        })
    })
}

/// numpy's API if it was looked up already (imports nothing).
pub(crate) fn numpy_api_if_loaded(py: Python<'_>) -> Option<&'static NumpyApi> {
    NUMPY.get(py)
}
