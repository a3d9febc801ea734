//! `KdaLayer` (one KDA layer of a checkpoint) and `KdaCache` (its per-sequence conv and
//! recurrent states), over kda-host through [`crate::core_api`].

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::array::F32Array;
use crate::compute::no_panic;
use crate::core_api::{self, LayerShape, Model, ModelCache, Runner};
use crate::threads;

/// One KDA layer of a Kimi Linear / Kimi K3 checkpoint (weights memory-mapped).
#[pyclass(module = "kda._core", frozen)]
pub struct KdaLayer {
    model: Arc<Model>,
    layer: usize,
    shape: LayerShape,
    runner: Mutex<Runner>,
}

/// The conv and recurrent states of `N` sequences for one `KdaLayer`.
#[pyclass(module = "kda._core")]
pub struct KdaCache {
    model: Arc<Model>,
    layer: usize,
    cache: ModelCache,
}

impl KdaLayer {
    fn check_cache(&self, c: &KdaCache) -> PyResult<()> {
        if Arc::ptr_eq(&self.model, &c.model) && self.layer == c.layer {
            Ok(())
        } else {
            Err(PyValueError::new_err(
                "cache: belongs to another layer (make it with this layer's new_cache)",
            ))
        }
    }

    /// Checks `x` `[rows, hidden]` and `out` (same shape, writable, not overlapping `x`).
    fn io<'a>(
        &self,
        x: &Bound<'_, PyAny>,
        out: &Bound<'_, PyAny>,
        rows_name: &str,
    ) -> PyResult<(&'a [f32], &'a mut [f32], usize)> {
        let xa = F32Array::new(x, "x")?;
        let oa = F32Array::new(out, "out")?;
        let hidden = self.shape.hidden;
        let rows = match xa.shape[..] {
            [r, h] if h == hidden => r,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "x: expected shape [{rows_name}, {hidden}], got {:?}",
                    xa.shape
                )))
            }
        };
        if oa.shape != xa.shape {
            return Err(PyValueError::new_err(format!(
                "out: expected shape {:?}, got {:?}",
                xa.shape, oa.shape
            )));
        }
        if oa.overlaps(&xa) {
            return Err(PyValueError::new_err("out: must not share memory with x"));
        }
        Ok((xa.as_slice(), oa.as_mut_slice("out")?, rows))
    }
}

#[pymethods]
impl KdaLayer {
    /// Loads model layer `layer` (0-based) of the checkpoint folder `path`, with the
    /// projections' arithmetic `precision` (`"exact"` or `"bf16"`).
    #[staticmethod]
    #[pyo3(signature = (path, layer, precision="exact"))]
    fn from_pretrained(
        py: Python<'_>,
        path: PathBuf,
        layer: usize,
        precision: &str,
    ) -> PyResult<Self> {
        let (model, shape) =
            py.detach(|| no_panic(|| core_api::open_layer(&path, layer, precision)))?;
        Ok(KdaLayer {
            model: Arc::new(model),
            layer,
            shape,
            runner: Mutex::new(Runner::default()),
        })
    }

    /// Model layer number (0-based).
    #[getter]
    fn layer(&self) -> usize {
        self.layer
    }

    /// Hidden size.
    #[getter]
    fn hidden(&self) -> usize {
        self.shape.hidden
    }

    /// KDA heads.
    #[getter]
    fn heads(&self) -> usize {
        self.shape.heads
    }

    /// Head dimension.
    #[getter]
    fn head_dim(&self) -> usize {
        self.shape.head_dim
    }

    /// Short-conv width.
    #[getter]
    fn conv_width(&self) -> usize {
        self.shape.conv_width
    }

    /// A zeroed cache for `sequences` sequences.
    #[pyo3(signature = (sequences=1))]
    fn new_cache(&self, sequences: usize) -> PyResult<KdaCache> {
        let cache = no_panic(|| core_api::new_cache(&self.model, sequences))?;
        Ok(KdaCache {
            model: self.model.clone(),
            layer: self.layer,
            cache,
        })
    }

    /// Prefill: runs packed sequences `x` `[T, hidden]` (split by `cu_seqlens`) from the
    /// states in `cache`, updates them, writes the layer output to `out` `[T, hidden]`.
    #[pyo3(signature = (x, cache, out, cu_seqlens, threads=None))]
    fn prefill(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        mut cache: PyRefMut<'_, KdaCache>,
        out: &Bound<'_, PyAny>,
        cu_seqlens: Vec<usize>,
        threads: Option<usize>,
    ) -> PyResult<()> {
        self.check_cache(&cache)?;
        let (x, out, _) = self.io(x, out, "T")?;
        let n = threads::resolve(threads)?;
        let c = &mut cache.cache;
        py.detach(|| {
            no_panic(|| {
                let mut guard = self.runner.lock().unwrap_or_else(|e| e.into_inner());
                let runner: &mut Runner = &mut guard;
                let y = threads::install(n, || {
                    core_api::prefill(&self.model, runner, self.layer, x, &cu_seqlens, c)
                })?;
                out.copy_from_slice(&y);
                Ok(())
            })
        })
    }

    /// One decode step of every sequence of `cache`: `x` `[N, hidden]` → `out` `[N, hidden]`.
    #[pyo3(signature = (x, cache, out, threads=None))]
    fn decode(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        mut cache: PyRefMut<'_, KdaCache>,
        out: &Bound<'_, PyAny>,
        threads: Option<usize>,
    ) -> PyResult<()> {
        self.check_cache(&cache)?;
        let (x, out, rows) = self.io(x, out, "N")?;
        if rows != cache.cache.sequences {
            return Err(PyValueError::new_err(format!(
                "x: expected one row per cached sequence ({}), got {rows}",
                cache.cache.sequences
            )));
        }
        let n = threads::resolve(threads)?;
        let c = &mut cache.cache;
        py.detach(|| {
            no_panic(|| {
                let mut guard = self.runner.lock().unwrap_or_else(|e| e.into_inner());
                let runner: &mut Runner = &mut guard;
                let y = threads::install(n, || {
                    core_api::decode(&self.model, runner, self.layer, x, c)
                })?;
                out.copy_from_slice(&y);
                Ok(())
            })
        })
    }

    /// Reads a cache saved by `KdaCache.save` (it must match this layer's shapes).
    fn load_cache(&self, path: PathBuf) -> PyResult<KdaCache> {
        let cache = no_panic(|| core_api::load_cache(&path, &self.model))?;
        Ok(KdaCache {
            model: self.model.clone(),
            layer: self.layer,
            cache,
        })
    }

    /// A cache from `KdaCache.to_bytes` output.
    fn cache_from_bytes(&self, data: &[u8]) -> PyResult<KdaCache> {
        let cache = no_panic(|| core_api::cache_from_bytes(data, "<bytes>", &self.model))?;
        Ok(KdaCache {
            model: self.model.clone(),
            layer: self.layer,
            cache,
        })
    }
}

#[pymethods]
impl KdaCache {
    /// Number of sequences.
    #[getter]
    fn sequences(&self) -> usize {
        self.cache.sequences
    }

    /// An independent copy (to fork a prefix).
    fn clone(&self) -> KdaCache {
        KdaCache {
            model: self.model.clone(),
            layer: self.layer,
            cache: self.cache.clone(),
        }
    }

    /// Zeroes every sequence's states.
    fn reset(&mut self) {
        self.cache.reset();
    }

    /// Writes the cache to `path` (a safetensors file; replaced atomically).
    fn save(&self, path: PathBuf) -> PyResult<()> {
        no_panic(|| core_api::save_cache(&self.cache, &self.model, &path))
    }

    /// The cache as safetensors bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let b = no_panic(|| core_api::cache_to_bytes(&self.cache, &self.model))?;
        Ok(PyBytes::new(py, &b))
    }

    /// The recurrent states `[N, H, K, V]` (K-first) as float32 bytes.
    fn recurrent_state_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let s =
            no_panic(|| core_api::recurrent_state(&self.cache, self.layer).map(|s| s.to_vec()))?;
        let bytes: Vec<u8> = s.iter().flat_map(|v| v.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    fn __eq__(&self, other: &KdaCache) -> bool {
        Arc::ptr_eq(&self.model, &other.model) && self.cache == other.cache
    }
}
