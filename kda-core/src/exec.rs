//! How the layer's independent pieces of work are run: in order ([`Serial`], the default) or on
//! threads (the host's rayon executor implements [`Executor`]).
//!
//! The layer splits each block into tasks that write disjoint parts of its buffers: projection
//! tiles (output rows), then one task per (sequence, head) for conv → norm → recurrence or
//! chunked kernel → gated norm, then `o_proj` tiles. Every output element is computed by the same
//! code whichever worker runs it, so results are bitwise identical for any number of threads.

use core::marker::PhantomData;
use core::sync::atomic::{AtomicBool, Ordering};

/// Runs `tasks` independent tasks, possibly concurrently.
pub trait Executor: Sync {
    /// Most tasks that run at once; each gets a worker index below this (for its scratch).
    fn workers(&self) -> usize;

    /// Calls `f(task, worker)` once for every `task` in `0..tasks`, in any order and on any
    /// threads, and returns when all have finished. Two tasks running at the same time must
    /// have different `worker` indices, each `< workers()`.
    fn run(&self, tasks: usize, f: &(dyn Fn(usize, usize) + Sync));
}

/// Runs every task in order on the calling thread (worker 0).
#[derive(Debug, Default, Clone, Copy)]
pub struct Serial;

impl Executor for Serial {
    fn workers(&self) -> usize {
        1
    }

    fn run(&self, tasks: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        for t in 0..tasks {
            f(t, 0);
        }
    }
}

/// A mutable f32 buffer shared by concurrent tasks that each touch a disjoint part of it.
///
/// Out-of-range requests return `None` (or `false`) and never touch memory; overlap between
/// concurrent tasks is prevented by how the layer assigns ranges (per head, per token row, per
/// worker), which is what each `unsafe` call site's SAFETY comment argues.
pub(crate) struct Shared<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: `Shared` is a `&mut [f32]` split among tasks; f32 is Send + Sync, and the methods
// that hand out access require disjointness from their callers.
unsafe impl Send for Shared<'_> {}
// SAFETY: as above.
unsafe impl Sync for Shared<'_> {}

impl<'a> Shared<'a> {
    pub(crate) fn new(s: &'a mut [f32]) -> Self {
        Shared {
            ptr: s.as_mut_ptr(),
            len: s.len(),
            _borrow: PhantomData,
        }
    }

    /// `&mut self[start..start + len]`, or `None` when out of range.
    ///
    /// # Safety
    /// No other live reference (from this or another task) may overlap the range while the
    /// returned slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self, start: usize, len: usize) -> Option<&'a mut [f32]> {
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: in bounds (checked); exclusivity is the caller's contract.
        Some(unsafe { core::slice::from_raw_parts_mut(self.ptr.add(start), len) })
    }

    /// Writes one element; false when out of range.
    ///
    /// # Safety
    /// No other task may access element `i` concurrently.
    pub(crate) unsafe fn write(&self, i: usize, v: f32) -> bool {
        if i >= self.len {
            return false;
        }
        // SAFETY: in bounds (checked); exclusivity is the caller's contract.
        unsafe { self.ptr.add(i).write(v) };
        true
    }
}

/// Records that some task hit an internal error (tasks cannot return values).
#[derive(Default)]
pub(crate) struct Failed(AtomicBool);

impl Failed {
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_checks_bounds() {
        let mut v = [0.0f32; 4];
        let s = Shared::new(&mut v);
        // SAFETY: single-threaded, no overlapping borrows.
        unsafe {
            assert!(s.slice(2, 3).is_none());
            assert!(s.slice(usize::MAX, 2).is_none());
            assert!(!s.write(4, 1.0));
            assert!(s.write(3, 1.0));
            s.slice(0, 2).unwrap()[1] = 2.0;
        }
        assert_eq!(v, [0.0, 2.0, 0.0, 1.0]);
    }

    #[test]
    fn serial_runs_every_task_once_in_order() {
        let seen = std::sync::Mutex::new(std::vec::Vec::new());
        Serial.run(3, &|t, wk| seen.lock().unwrap().push((t, wk)));
        assert_eq!(*seen.lock().unwrap(), [(0, 0), (1, 0), (2, 0)]);
    }
}
