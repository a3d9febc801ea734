//! Pointer/length pairs from C turned into slices, after every check that makes that sound.

use core::mem::{align_of, size_of};

use crate::status::{Fail, KdaStatus, Res};

/// Byte range `[start, end)` of a buffer, for the overlap check.
#[derive(Debug, Clone, Copy)]
struct Range {
    start: usize,
    end: usize,
    writable: bool,
}

/// Checks `ptr` (NULL, alignment) and the byte size of `len` elements (no overflow, within
/// `isize::MAX`, no wrap past the end of the address space); returns the byte range.
fn check<T>(ptr: *const T, len: usize) -> Res<Option<(usize, usize)>> {
    if len == 0 {
        return Ok(None);
    }
    if ptr.is_null() {
        return Err(KdaStatus::NullPointer.into());
    }
    let start = ptr.addr();
    if start.checked_rem(align_of::<T>()) != Some(0) {
        return Err(KdaStatus::BadAlignment.into());
    }
    let bytes = len
        .checked_mul(size_of::<T>())
        .filter(|&b| isize::try_from(b).is_ok())
        .ok_or(Fail::from(KdaStatus::Overflow))?;
    let end = start
        .checked_add(bytes)
        .ok_or(Fail::from(KdaStatus::Overflow))?;
    Ok(Some((start, end)))
}

/// The buffers of one call, so that no writable one overlaps another (Rust's `&mut` must not
/// alias). Fixed capacity: a call has at most [`Buffers::CAP`] buffers.
#[derive(Debug)]
pub(crate) struct Buffers {
    ranges: [Range; Buffers::CAP],
    n: usize,
}

impl Buffers {
    const CAP: usize = 12;

    pub(crate) fn new() -> Self {
        Buffers {
            ranges: [Range {
                start: 0,
                end: 0,
                writable: false,
            }; Buffers::CAP],
            n: 0,
        }
    }

    fn add(&mut self, r: Option<(usize, usize)>, writable: bool) -> Res {
        let Some((start, end)) = r else {
            return Ok(());
        };
        let new = Range {
            start,
            end,
            writable,
        };
        let seen = self.ranges.get(..self.n).unwrap_or(&[]);
        if seen
            .iter()
            .any(|o| (o.writable || writable) && o.start < end && start < o.end)
        {
            return Err(KdaStatus::Overlap.into());
        }
        let slot = self
            .ranges
            .get_mut(self.n)
            .ok_or(Fail::from(KdaStatus::Internal))?;
        *slot = new;
        self.n = self
            .n
            .checked_add(1)
            .ok_or(Fail::from(KdaStatus::Internal))?;
        Ok(())
    }

    /// Checks that no writable buffer of the call overlaps `s` (read-only data the call
    /// reads but did not pass: the layer's weights).
    pub(crate) fn check_not_written<T>(&self, s: &[T]) -> Res {
        let Some(bytes) = s.len().checked_mul(size_of::<T>()) else {
            return Err(KdaStatus::Overflow.into());
        };
        self.check_range_not_written(s.as_ptr().addr(), bytes)
    }

    /// As [`Buffers::check_not_written`], for the byte range `start .. start + bytes`.
    pub(crate) fn check_range_not_written(&self, start: usize, bytes: usize) -> Res {
        let end = start.saturating_add(bytes);
        let seen = self.ranges.get(..self.n).unwrap_or(&[]);
        if seen
            .iter()
            .any(|o| o.writable && o.start < end && start < o.end)
        {
            return Err(KdaStatus::Overlap.into());
        }
        Ok(())
    }

    /// A read-only slice of `len` elements at `ptr` (NULL allowed when `len` is 0).
    ///
    /// # Safety
    /// When `len > 0`, `ptr` must point to `len` initialised elements that nothing writes to
    /// for `'a` (the C caller's contract, stated in the header).
    pub(crate) unsafe fn slice<'a, T>(&mut self, ptr: *const T, len: usize) -> Res<&'a [T]> {
        let r = check(ptr, len)?;
        self.add(r, false)?;
        // SAFETY: checked above: non-NULL, aligned, byte size within isize::MAX; the caller
        // guarantees the memory.
        Ok(unsafe { slice_unchecked(ptr, len) })
    }

    /// A writable slice of `len` elements at `ptr`, disjoint from every other buffer of the
    /// call.
    ///
    /// # Safety
    /// When `len > 0`, `ptr` must point to `len` initialised elements that nothing else
    /// accesses for `'a`.
    pub(crate) unsafe fn slice_mut<'a, T>(&mut self, ptr: *mut T, len: usize) -> Res<&'a mut [T]> {
        let r = check(ptr.cast_const(), len)?;
        self.add(r, true)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: checked above (non-NULL, aligned, size, no overlap with the call's other
        // buffers); the caller guarantees the memory.
        Ok(unsafe { core::slice::from_raw_parts_mut(ptr, len) })
    }
}

/// A read-only slice without overlap tracking (weights: read-only, may share memory).
///
/// # Safety
/// As [`Buffers::slice`].
pub(crate) unsafe fn weight_slice<'a, T>(ptr: *const T, len: usize) -> Res<&'a [T]> {
    check(ptr, len)?;
    // SAFETY: checked above; the caller guarantees the memory.
    Ok(unsafe { slice_unchecked(ptr, len) })
}

/// # Safety
/// `ptr` non-NULL and aligned with `len` valid elements, or `len == 0`.
unsafe fn slice_unchecked<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's contract.
        unsafe { core::slice::from_raw_parts(ptr, len) }
    }
}

/// A reference to a C struct passed by pointer: NULL and alignment checked.
///
/// # Safety
/// A non-NULL `ptr` must point to a valid, initialised `T` for `'a`.
pub(crate) unsafe fn get<'a, T>(ptr: *const T) -> Res<&'a T> {
    if ptr.is_null() {
        return Err(KdaStatus::NullPointer.into());
    }
    if ptr.addr().checked_rem(align_of::<T>()) != Some(0) {
        return Err(KdaStatus::BadAlignment.into());
    }
    // SAFETY: non-NULL and aligned; the caller guarantees a valid `T`.
    Ok(unsafe { &*ptr })
}

/// An out-pointer (memory the call writes, possibly uninitialised): NULL and alignment checked,
/// no reference made.
pub(crate) fn out_ptr<T>(ptr: *mut T) -> Res<*mut T> {
    if ptr.is_null() {
        return Err(KdaStatus::NullPointer.into());
    }
    if ptr.addr().checked_rem(align_of::<T>()) != Some(0) {
        return Err(KdaStatus::BadAlignment.into());
    }
    Ok(ptr)
}

/// Writes a sizing function's result through its out-pointer.
///
/// # Safety
/// A non-NULL `out` must point to writable memory for a `usize`.
pub(crate) unsafe fn put(out: *mut usize, v: usize) -> Res {
    if out.is_null() {
        return Err(KdaStatus::NullPointer.into());
    }
    if out.addr().checked_rem(align_of::<usize>()) != Some(0) {
        return Err(KdaStatus::BadAlignment.into());
    }
    // SAFETY: non-NULL, aligned; the caller guarantees it is writable.
    unsafe { out.write(v) };
    Ok(())
}

/// A `core::fmt::Write` into a caller's char buffer: truncates, always NUL-terminates.
pub(crate) struct CBuf<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> CBuf<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        if let Some(b) = buf.first_mut() {
            *b = 0;
        }
        CBuf { buf, len: 0 }
    }
}

impl core::fmt::Write for CBuf<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for &b in s.as_bytes() {
            // Keep one byte for the terminating NUL.
            let Some(next) = self.len.checked_add(1) else {
                break;
            };
            if next >= self.buf.len() {
                break;
            }
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = b;
            }
            self.len = next;
        }
        if let Some(nul) = self.buf.get_mut(self.len) {
            *nul = 0;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_null_alignment_overflow_overlap() {
        let mut data = [0f32; 8];
        let p = data.as_mut_ptr();
        let mut b = Buffers::new();
        // SAFETY: every pointer below either points into `data` or is rejected before use.
        unsafe {
            assert_eq!(
                b.slice::<f32>(core::ptr::null(), 3).err().map(|f| f.status),
                Some(KdaStatus::NullPointer)
            );
            assert!(b.slice::<f32>(core::ptr::null(), 0).is_ok());
            let odd = p.cast::<u8>().add(1).cast::<f32>();
            assert_eq!(
                b.slice(odd, 1).err().map(|f| f.status),
                Some(KdaStatus::BadAlignment)
            );
            assert_eq!(
                b.slice(p, usize::MAX / 2).err().map(|f| f.status),
                Some(KdaStatus::Overflow)
            );
            assert!(b.slice(p, 4).is_ok());
            assert!(b.slice(p.add(2), 4).is_ok(), "two inputs may overlap");
            assert_eq!(
                b.slice_mut(p.add(3), 2).err().map(|f| f.status),
                Some(KdaStatus::Overlap)
            );
            assert!(b.slice_mut(p.add(6), 2).is_ok());
            assert_eq!(
                b.slice(p.add(7), 1).err().map(|f| f.status),
                Some(KdaStatus::Overlap)
            );
        }
    }

    #[test]
    fn cbuf_truncates_and_terminates() {
        use core::fmt::Write;
        let mut m = [0xFFu8; 6];
        let mut w = CBuf::new(&mut m);
        write!(w, "abcdefgh").unwrap();
        assert_eq!(&m, b"abcde\0");
        let mut none: [u8; 0] = [];
        write!(CBuf::new(&mut none), "x").unwrap();
    }
}
