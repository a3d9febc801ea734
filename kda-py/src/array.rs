//! Zero-copy views of Python arrays through the numpy array interface: its C side
//! (`__array_struct__`, a capsule holding a `PyArrayInterface`) when it describes a usable
//! array, else its Python side (`__array_interface__`, version 3, which also names what is
//! wrong). C-contiguous, aligned, native-endian float32 only.
//!
//! The buffer protocol is not part of the stable ABI before Python 3.11, and this module is
//! built for abi3-py39, so arrays are read through the array interface instead. The views
//! borrow the Python objects, which the caller keeps alive for the whole call.

use std::ffi::{c_char, c_int, c_void};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;

/// numpy's `PyArrayInterface`, the struct behind `__array_struct__` (the array interface's
/// C side, a documented and versioned layout: `two` is always 2).
#[repr(C)]
struct ArrayStruct {
    two: c_int,
    nd: c_int,
    typekind: c_char,
    itemsize: c_int,
    flags: c_int,
    shape: *const isize,
    strides: *const isize,
    data: *mut c_void,
    descr: *mut c_void,
}

/// DLPack's `DLManagedTensor` (dlpack.h, the unversioned ABI of capsules named
/// `"dltensor"`): the `DLTensor` fields, then the producer's context and deleter.
#[repr(C)]
struct DlManagedTensor {
    data: *mut c_void,
    device_type: i32,
    device_id: i32,
    ndim: i32,
    dtype_code: u8,
    dtype_bits: u8,
    dtype_lanes: u16,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
    manager_ctx: *mut c_void,
    deleter: *mut c_void,
}

/// DLPack's `kDLCPU` device type and `kDLFloat` type code.
const DL_CPU: i32 = 1;
const DL_FLOAT: u8 = 2;

/// `PyArrayInterface.flags` bits: C-contiguous, aligned, native byte order, writable.
const C_CONTIGUOUS: c_int = 0x1;
const ALIGNED: c_int = 0x100;
const NOTSWAPPED: c_int = 0x200;
const WRITEABLE: c_int = 0x400;

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
    /// A view of `len(shape)`-dimensional float32 data at `addr`; an error if the size
    /// overflows or a non-empty array's address is null or misaligned.
    pub fn from_parts(
        addr: usize,
        shape: Vec<usize>,
        writable: bool,
        name: &str,
    ) -> PyResult<Self> {
        let len = shape
            .iter()
            .try_fold(1usize, |a, &b| a.checked_mul(b))
            .ok_or_else(|| PyValueError::new_err(format!("{name}: size overflows")))?;
        if len > 0 && (addr == 0 || !addr.is_multiple_of(std::mem::align_of::<f32>())) {
            return Err(PyValueError::new_err(format!(
                "{name}: data pointer is null or not 4-byte aligned"
            )));
        }
        Ok(F32Array {
            addr,
            len,
            shape,
            writable,
        })
    }

    /// Reads `obj.__array_struct__`: the view, or `None` if `obj` has none or it does not
    /// describe a C-contiguous, aligned, native-endian float32 array.
    pub fn from_array_struct(obj: &Bound<'_, PyAny>, name: &str) -> Option<Self> {
        let cap = obj.getattr(intern!(obj.py(), "__array_struct__")).ok()?;
        let cap = cap.cast::<PyCapsule>().ok()?;
        // numpy's capsule has no name.
        let ptr = cap.pointer_checked(None).ok()?;
        // SAFETY: a capsule returned by `__array_struct__` holds a `PyArrayInterface` (the
        // array interface protocol), valid while the capsule lives (`cap` is held until the
        // end of this function, and no Python code runs in between). `two == 2` is checked
        // before any other field is trusted.
        let s = unsafe { &*ptr.as_ptr().cast::<ArrayStruct>() };
        let need = C_CONTIGUOUS | ALIGNED | NOTSWAPPED;
        if s.two != 2 || s.typekind != b'f' as c_char || s.itemsize != 4 || s.flags & need != need {
            return None;
        }
        let nd = usize::try_from(s.nd).ok()?;
        let dims: &[isize] = if nd == 0 {
            &[]
        } else if s.shape.is_null() {
            return None;
        } else {
            // SAFETY: the protocol gives `nd` dimensions at `shape`, owned by the capsule.
            unsafe { std::slice::from_raw_parts(s.shape, nd) }
        };
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<Vec<_>>>()?;
        F32Array::from_parts(s.data as usize, shape, s.flags & WRITEABLE != 0, name).ok()
    }

    /// Reads an unconsumed DLPack capsule (named `"dltensor"`, left unconsumed: its destructor
    /// frees it, the producer's memory stays with the producer's object, which the caller
    /// holds): the view, or `None` unless it is a C-contiguous float32 tensor on the CPU.
    pub fn from_dlpack(capsule: &Bound<'_, PyAny>, name: &str) -> Option<Self> {
        let cap = capsule.cast::<PyCapsule>().ok()?;
        let ptr = cap.pointer_checked(Some(c"dltensor")).ok()?;
        // SAFETY: a capsule named "dltensor" holds a `DLManagedTensor` (the DLPack protocol),
        // alive until the capsule's destructor runs; `cap` is held until the end of this
        // function and no Python code runs in between.
        let t = unsafe { &*ptr.as_ptr().cast::<DlManagedTensor>() };
        if t.device_type != DL_CPU
            || (t.dtype_code, t.dtype_bits, t.dtype_lanes) != (DL_FLOAT, 32, 1)
            || t.data.is_null()
        {
            return None;
        }
        let nd = usize::try_from(t.ndim).ok()?;
        let dims: &[i64] = if nd == 0 {
            &[]
        } else {
            // SAFETY: the protocol gives `ndim` dimensions at `shape` (non-null for ndim > 0).
            unsafe { std::slice::from_raw_parts(t.shape, nd) }
        };
        let shape = dims
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<Vec<_>>>()?;
        if !t.strides.is_null() && nd > 0 {
            // SAFETY: as `shape`, `ndim` strides (in elements) when non-null.
            let strides = unsafe { std::slice::from_raw_parts(t.strides, nd) };
            // C-contiguous: each dimension longer than 1 steps by the product of the later ones.
            let mut step = 1i64;
            for (&d, &s) in dims.iter().zip(strides).rev() {
                if d != 1 && s != step {
                    return None;
                }
                step = step.checked_mul(d)?;
            }
        }
        let addr = (t.data as usize).checked_add(usize::try_from(t.byte_offset).ok()?)?;
        F32Array::from_parts(addr, shape, true, name).ok()
    }

    /// Reads `obj`'s array interface (the C side when it describes a usable array, else
    /// `__array_interface__`); `name` is the argument's name for messages.
    pub fn new(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<Self> {
        if let Some(a) = F32Array::from_array_struct(obj, name) {
            return Ok(a);
        }
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
        F32Array::from_parts(addr, shape, !readonly, name)
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
