//! Reuse of large output buffers between calls.
//!
//! glibc's `malloc` serves a request of 32 MiB or more (its largest dynamic mmap threshold)
//! with a fresh `mmap` and returns it to the system on `free`, so every large output —
//! `chunk_kda`'s `o` at T = 4096, H = 32, K = 128 is 64 MiB — is zero-filled page by page by
//! the kernel on first touch, inside the call: about 8–10 ms of a 0.21 s call on the test
//! machine. Smaller outputs stay in malloc's heap and are reused already.
//!
//! So an output of at least [`MIN_POOLED_BYTES`] is a view of a [`Buffer`]: an object that
//! owns a flat float32 numpy array (made by `numpy.empty`, so a failed allocation is numpy's
//! `MemoryError`) and shows its first elements through the array interface
//! (`numpy.asarray(buffer)`; torch outputs are tensors over those views). The buffer is the
//! views' `base`, kept alive by them; when the last one goes away, its array goes to a small
//! free list instead of back to the system — at most [`MAX_FREE`] arrays, [`MAX_FREE_BYTES`]
//! in all — and the next large output that it fits reuses it. `kda.empty_cache()` releases the
//! list. So memory is reused only once nothing refers to it, and an output is written in full
//! by the call that returns it, as with `numpy.empty`.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::array::F32Array;
use crate::numpy_api::NumpyApi;

/// Outputs at least this large come from the free list (glibc's largest dynamic mmap
/// threshold: below it freed memory stays in malloc's heap).
pub const MIN_POOLED_BYTES: usize = 32 << 20;
/// Most arrays kept for reuse.
pub const MAX_FREE: usize = 4;
/// Most bytes kept for reuse.
pub const MAX_FREE_BYTES: usize = 1 << 30;

/// What the free list holds: a buffer of `elements()` float32s.
pub trait Sized32 {
    /// Elements.
    fn elements(&self) -> usize;
}

impl Sized32 for Box<[f32]> {
    fn elements(&self) -> usize {
        self.len()
    }
}

/// Freed buffers kept for reuse, oldest first.
#[derive(Debug)]
pub struct FreeList<B> {
    buffers: Vec<B>,
}

impl<B: Sized32> Default for FreeList<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Sized32> FreeList<B> {
    /// An empty list.
    pub const fn new() -> Self {
        FreeList {
            buffers: Vec::new(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.elements() * 4).sum()
    }

    /// Buffers held.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// Whether the list holds nothing.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }

    /// The smallest held buffer of `len..=2·len` elements, taken off the list (a much larger
    /// one is left for a request it suits better).
    pub fn take(&mut self, len: usize) -> Option<B> {
        let (at, _) = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.elements() >= len && b.elements() / 2 <= len)
            .min_by_key(|(_, b)| b.elements())?;
        Some(self.buffers.remove(at))
    }

    /// Keeps `b` for reuse, dropping the oldest buffers beyond [`MAX_FREE`] /
    /// [`MAX_FREE_BYTES`] (a buffer larger than the byte limit is not kept); returns what it
    /// dropped, for the caller to release outside the list's lock.
    pub fn put(&mut self, b: B) -> Vec<B> {
        if b.elements() * 4 > MAX_FREE_BYTES {
            return vec![b];
        }
        self.buffers.push(b);
        let mut dropped = Vec::new();
        while self.buffers.len() > MAX_FREE || self.bytes() > MAX_FREE_BYTES {
            dropped.push(self.buffers.remove(0));
        }
        dropped
    }

    /// Takes every held buffer off the list.
    pub fn clear(&mut self) -> Vec<B> {
        std::mem::take(&mut self.buffers)
    }
}

/// A flat float32 numpy array of `len` elements (C-contiguous and aligned: `numpy.empty`'s).
struct Storage {
    /// The array: owns the memory (read only by its drop).
    _array: Py<PyAny>,
    addr: usize,
    len: usize,
}

impl Sized32 for Storage {
    fn elements(&self) -> usize {
        self.len
    }
}

static FREE: Mutex<FreeList<Storage>> = Mutex::new(FreeList::new());

/// Runs `f` on the free list. It stays consistent whatever panicked while it was held (every
/// operation on it is a single push or remove), and no Python code runs under its lock: what
/// `f` takes off the list is released by the caller afterwards.
fn with_free_list<T>(f: impl FnOnce(&mut FreeList<Storage>) -> T) -> T {
    f(&mut FREE.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Memory for `len` elements: an array of the free list, or a new one (`numpy.empty`: zero
/// pages from the system, a `MemoryError` if there is not enough).
fn storage(py: Python<'_>, np: &NumpyApi, len: usize) -> PyResult<Storage> {
    if let Some(s) = with_free_list(|f| f.take(len)) {
        return Ok(s);
    }
    let array = np.empty.bind(py).call1((len, np.float32.bind(py)))?;
    let view = F32Array::from_array_struct(&array, "output").ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err(
            "internal error in kda (please report): numpy.empty made no contiguous float32 array",
        )
    })?;
    Ok(Storage {
        addr: view.as_slice().as_ptr() as usize,
        _array: array.unbind(),
        len,
    })
}

/// The memory under a large output, shown to numpy through the array interface (version 3)
/// as a writable C-contiguous float32 array of `shape`; it goes back to the free list when the
/// last array over it is gone.
#[pyclass(frozen, module = "kda._core")]
pub struct Buffer {
    /// The memory (`None` only once dropped).
    storage: Option<Storage>,
    /// The shape shown (its elements are the first ones of the storage).
    shape: Vec<usize>,
}

#[pymethods]
impl Buffer {
    /// numpy's array interface.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let addr = self.storage.as_ref().map_or(0, |s| s.addr);
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", "<f4")?;
        d.set_item("data", (addr, false))?;
        d.set_item("version", 3)?;
        Ok(d)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(s) = self.storage.take() {
            // Released here, outside the list's lock (dropping a numpy array runs its code).
            drop(with_free_list(|f| f.put(s)));
        }
    }
}

/// A new uninitialised float32 numpy array of `shape` (`numpy.empty`); a view of a pooled
/// [`Buffer`] when it is [`MIN_POOLED_BYTES`] or larger.
pub(crate) fn empty<'py>(
    py: Python<'py>,
    np: &NumpyApi,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let pooled = shape
        .iter()
        .try_fold(1usize, |n, &s| n.checked_mul(s))
        .filter(|&n| n.checked_mul(4).is_some_and(|b| b >= MIN_POOLED_BYTES));
    let Some(len) = pooled else {
        // Small, or too large to count: numpy's own (and its error).
        return np
            .empty
            .bind(py)
            .call1((PyTuple::new(py, shape)?, np.float32.bind(py)));
    };
    let buffer = Buffer {
        storage: Some(storage(py, np, len)?),
        shape: shape.to_vec(),
    };
    np.asarray.bind(py).call1((Bound::new(py, buffer)?,))
}

/// Releases the arrays kept for reuse (`kda.empty_cache()`).
#[pyfunction]
pub fn empty_cache() {
    drop(with_free_list(FreeList::clear));
}

/// `(arrays, bytes)` kept for reuse now.
#[pyfunction]
pub fn cache_info() -> (usize, usize) {
    with_free_list(|f| (f.len(), f.bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(len: usize) -> Box<[f32]> {
        vec![0.0; len].into_boxed_slice()
    }

    #[test]
    fn take_picks_the_smallest_fitting_buffer() {
        let mut f = FreeList::new();
        for len in [100, 60, 300] {
            assert!(f.put(buf(len)).is_empty());
        }
        assert_eq!(f.take(50).map(|b| b.len()), Some(60));
        assert_eq!(f.take(50).map(|b| b.len()), Some(100));
        // 300 is more than twice 120: left for a request it suits.
        assert_eq!(f.take(120).map(|b| b.len()), None);
        assert_eq!(f.take(150).map(|b| b.len()), Some(300));
        assert!(f.is_empty());
    }

    #[test]
    fn put_keeps_the_newest_within_the_limits() {
        let mut f = FreeList::new();
        let mut dropped = Vec::new();
        for len in 1..=MAX_FREE + 2 {
            dropped.extend(f.put(buf(len)));
        }
        assert_eq!(f.len(), MAX_FREE);
        assert_eq!(dropped.iter().map(|b| b.len()).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(
            f.take(1).map(|b| b.len()),
            Some(3),
            "the two oldest were dropped"
        );
        let big = MAX_FREE_BYTES / 4 / 2 + 1;
        f.put(buf(big));
        f.put(buf(big));
        assert!(f.bytes() <= MAX_FREE_BYTES);
        assert_eq!(f.len(), 1, "{:?}", f.bytes());
        assert_eq!(f.clear().len(), 1);
        assert_eq!(f.put(buf(MAX_FREE_BYTES / 4 + 1)).len(), 1);
        assert!(f.is_empty(), "a buffer over the byte limit is not kept");
    }
}
