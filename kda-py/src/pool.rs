//! Reuse of large output buffers between calls.
//!
//! glibc's `malloc` serves a request of 32 MiB or more (its largest dynamic mmap threshold)
//! with a fresh `mmap` and returns it to the system on `free`, so every large output —
//! `chunk_kda`'s `o` at T = 4096, H = 32, K = 128 is 64 MiB — is zero-filled page by page by
//! the kernel on first touch, inside the call: about 8–10 ms of a 0.21 s call on the test
//! machine. Smaller outputs stay in malloc's heap and are reused already.
//!
//! So outputs of at least [`MIN_POOLED_BYTES`] are [`Buffer`]s: numpy arrays over memory this
//! module owns (through the array interface, `numpy.asarray(buffer)`, torch tensors over
//! those). When the last array over a buffer goes away, its memory goes back to a small free
//! list instead of the system — at most [`MAX_FREE`] buffers, [`MAX_FREE_BYTES`] in all — and
//! the next large output of a size it fits reuses it. `kda.empty_cache()` releases the list.
//!
//! Only memory no array refers to any more is ever reused (the buffer object is the arrays'
//! `base`, kept alive by them), and an output is written in full by the call that returns it,
//! as with `numpy.empty`.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Outputs at least this large come from the free list (glibc's largest dynamic mmap
/// threshold: below it freed memory stays in malloc's heap).
pub const MIN_POOLED_BYTES: usize = 32 << 20;
/// Most buffers kept for reuse.
pub const MAX_FREE: usize = 4;
/// Most bytes kept for reuse.
pub const MAX_FREE_BYTES: usize = 1 << 30;

/// Freed buffers kept for reuse, oldest first.
#[derive(Debug, Default)]
pub struct FreeList {
    buffers: Vec<Box<[f32]>>,
}

impl FreeList {
    /// An empty list.
    pub const fn new() -> Self {
        FreeList {
            buffers: Vec::new(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.buffers.iter().map(|b| b.len() * 4).sum()
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
    pub fn take(&mut self, len: usize) -> Option<Box<[f32]>> {
        let (at, _) = self
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len && b.len() / 2 <= len)
            .min_by_key(|(_, b)| b.len())?;
        Some(self.buffers.remove(at))
    }

    /// Keeps `b` for reuse, dropping the oldest buffers beyond [`MAX_FREE`] /
    /// [`MAX_FREE_BYTES`] (a buffer larger than the byte limit is not kept).
    pub fn put(&mut self, b: Box<[f32]>) {
        if b.len() * 4 > MAX_FREE_BYTES {
            return;
        }
        self.buffers.push(b);
        while self.buffers.len() > MAX_FREE || self.bytes() > MAX_FREE_BYTES {
            self.buffers.remove(0);
        }
    }

    /// Drops every held buffer.
    pub fn clear(&mut self) {
        self.buffers.clear();
    }
}

static FREE: Mutex<FreeList> = Mutex::new(FreeList::new());

fn free_list() -> std::sync::MutexGuard<'static, FreeList> {
    // The list stays consistent whatever panicked while it was held: every operation on it
    // is a single push / remove.
    FREE.lock().unwrap_or_else(|e| e.into_inner())
}

/// `len` elements for an output: a buffer of the free list, or new memory (zero pages from
/// the system, as `numpy.empty` gets them). Its first `len` elements are the output.
fn storage(len: usize) -> Box<[f32]> {
    free_list()
        .take(len)
        .unwrap_or_else(|| vec![0.0f32; len].into_boxed_slice())
}

/// Memory under large outputs, exposed to numpy through the array interface (version 3); the
/// arrays over it keep it alive, and its memory goes back to the free list when they are all
/// gone.
#[pyclass(frozen, module = "kda._core")]
pub struct Buffer {
    /// The memory (empty only once dropped).
    data: Box<[f32]>,
    /// Address of the first element.
    addr: usize,
    /// The array's shape (its elements are the first ones of `data`).
    shape: Vec<usize>,
}

#[pymethods]
impl Buffer {
    /// numpy's array interface: a writable, C-contiguous float32 array of `shape`.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", "<f4")?;
        d.set_item("data", (self.addr, false))?;
        d.set_item("version", 3)?;
        Ok(d)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let data = std::mem::take(&mut self.data);
        if !data.is_empty() {
            free_list().put(data);
        }
    }
}

/// A new uninitialised float32 numpy array of `shape` (`numpy.empty`); from the free list
/// when it is [`MIN_POOLED_BYTES`] or larger.
pub fn empty<'py>(
    py: Python<'py>,
    np_empty: &Bound<'py, PyAny>,
    np_asarray: &Bound<'py, PyAny>,
    np_float32: &Bound<'py, PyAny>,
    shape: &[usize],
) -> PyResult<Bound<'py, PyAny>> {
    let len = shape
        .iter()
        .try_fold(1usize, |n, &s| n.checked_mul(s))
        .filter(|n| n.checked_mul(4).is_some())
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!("output shape {shape:?} is too large"))
        })?;
    if len * 4 < MIN_POOLED_BYTES {
        return np_empty.call1((PyTuple::new(py, shape)?, np_float32));
    }
    let data = storage(len);
    let buffer = Buffer {
        addr: data.as_ptr() as usize,
        data,
        shape: shape.to_vec(),
    };
    np_asarray.call1((Bound::new(py, buffer)?,))
}

/// Releases the buffers kept for reuse (`kda.empty_cache()`).
#[pyfunction]
pub fn empty_cache() {
    free_list().clear();
}

/// `(buffers, bytes)` kept for reuse now.
#[pyfunction]
pub fn cache_info() -> (usize, usize) {
    let f = free_list();
    (f.len(), f.bytes())
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
        f.put(buf(100));
        f.put(buf(60));
        f.put(buf(300));
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
        for len in 1..=MAX_FREE + 2 {
            f.put(buf(len));
        }
        assert_eq!(f.len(), MAX_FREE);
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
        f.clear();
        f.put(buf(MAX_FREE_BYTES / 4 + 1));
        assert!(f.is_empty(), "a buffer over the byte limit is not kept");
    }
}
