//! Zero-copy views of Python arrays through the numpy array interface
//! (`__array_interface__`, version 3): C-contiguous, aligned, native-endian float32 only.
//!
//! The buffer protocol is not part of the stable ABI before Python 3.11, and this module is
//! built for abi3-py39, so arrays are read through the array interface instead. The views
//! borrow the Python objects, which the caller keeps alive for the whole call.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;

/// One float32 array seen through its array interface.
pub struct F32Array {
    /// Address of the first element.
    addr: usize,
    /// Elements.
    pub len: usize,
    /// Shape.
    pub shape: Vec<usize>,
    /// Whether the array may be written.
    writable: bool,
}

impl F32Array {
    /// Reads `obj.__array_interface__`; `name` is the argument's name for messages.
    pub fn new(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        let py = obj.py();
        let iface = obj
            .getattr(intern!(py, "__array_interface__"))
            .map_err(|_| {
                PyTypeError::new_err(format!(
                    "{name}: expected a numpy array (an object with __array_interface__), got {}",
                    obj.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
            })?;
        let typestr: String = iface.get_item(intern!(py, "typestr"))?.extract()?;
        if typestr != "<f4" {
            return Err(PyTypeError::new_err(format!(
                "{name}: expected float32 ('<f4'), got '{typestr}'"
            )));
        }
        if let Ok(strides) = iface.get_item(intern!(py, "strides")) {
            if !strides.is_none() {
                return Err(PyValueError::new_err(format!(
                    "{name}: expected a C-contiguous array"
                )));
            }
        }
        let shape: Vec<usize> = iface.get_item(intern!(py, "shape"))?.extract()?;
        let (addr, readonly): (usize, bool) = iface.get_item(intern!(py, "data"))?.extract()?;
        let len = shape
            .iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .ok_or_else(|| PyValueError::new_err(format!("{name}: size overflows")))?;
        if len > 0 && (addr == 0 || addr % std::mem::align_of::<f32>() != 0) {
            return Err(PyValueError::new_err(format!(
                "{name}: data pointer is null or not 4-byte aligned"
            )));
        }
        Ok(F32Array {
            addr,
            len,
            shape,
            writable: !readonly,
        })
    }

    /// The byte range `[start, end)` this array covers.
    fn range(&self) -> (usize, usize) {
        (self.addr, self.addr + 4 * self.len)
    }

    /// Whether the two arrays share any byte.
    pub fn overlaps(&self, other: &F32Array) -> bool {
        let (a0, a1) = self.range();
        let (b0, b1) = other.range();
        self.len > 0 && other.len > 0 && a0 < b1 && b0 < a1
    }

    /// The elements, read-only.
    ///
    /// The Python object this view came from must stay alive, and must not be resized, while
    /// the slice is used (the caller holds a reference to it for the whole call).
    pub fn as_slice<'a>(&self) -> &'a [f32] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `addr` is non-null and 4-byte aligned (checked in `new`), and the array
        // interface guarantees `len` contiguous float32 elements there. The object is kept
        // alive by the caller for the lifetime of the slice. Writes by other Python threads
        // while the GIL is released are the caller's race, as with any numpy extension.
        unsafe { std::slice::from_raw_parts(self.addr as *const f32, self.len) }
    }

    /// The elements, writable; the array must be writable and must not overlap any array
    /// the call reads (checked by the caller with [`F32Array::overlaps`]).
    pub fn as_mut_slice<'a>(&self, name: &str) -> PyResult<&'a mut [f32]> {
        if !self.writable {
            return Err(PyValueError::new_err(format!("{name}: array is read-only")));
        }
        if self.len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `as_slice`; in addition the array is writable and the caller checked
        // that it overlaps no other array of the call, so this is the only reference to it.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut f32, self.len) })
    }
}
