//! How the layer's independent pieces of work are run: in order ([`Serial`], the default) or on
//! threads (the host's rayon executor implements [`Executor`]).
//!
//! The layer splits each block into tasks that write disjoint parts of its buffers: projection
//! tiles (output rows), then one task per (sequence, head) for conv → norm → recurrence or
//! chunked kernel → gated norm, then `o_proj` tiles. Every output element is computed by the same
//! code whichever worker runs it, so results are bitwise identical for any number of threads.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::sync::atomic::{AtomicU8, Ordering};

use crate::error::KdaError;

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

    /// `&mut self[start..start + len]`, or [`KdaError::Internal`] naming `what` when out of
    /// range (the layer's plan guarantees the ranges, so this is a bug check that keeps the
    /// unsafe access sound).
    ///
    /// # Safety
    /// No other live reference (from this or another task) may overlap the range while the
    /// returned slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(
        &self,
        what: &'static str,
        start: usize,
        len: usize,
    ) -> Result<&'a mut [f32], KdaError> {
        match start.checked_add(len) {
            // SAFETY: in bounds (checked); exclusivity is the caller's contract.
            Some(end) if end <= self.len => {
                Ok(unsafe { core::slice::from_raw_parts_mut(self.ptr.add(start), len) })
            }
            _ => Err(KdaError::Internal { what }),
        }
    }

    /// Writes one element; [`KdaError::Internal`] naming `what` when out of range.
    ///
    /// # Safety
    /// No other task may access element `i` concurrently.
    pub(crate) unsafe fn write(
        &self,
        what: &'static str,
        i: usize,
        v: f32,
    ) -> Result<(), KdaError> {
        if i >= self.len {
            return Err(KdaError::Internal { what });
        }
        // SAFETY: in bounds (checked); exclusivity is the caller's contract.
        unsafe { self.ptr.add(i).write(v) };
        Ok(())
    }
}

/// The first error of a round of tasks (tasks cannot return values). The first task to fail
/// records its error; later failures of the same round are dropped.
#[derive(Default)]
pub(crate) struct FirstError {
    /// 0: empty, 1: being written, 2: written.
    state: AtomicU8,
    error: UnsafeCell<Option<KdaError>>,
}

// SAFETY: `error` is written by exactly one thread (the one that moved `state` from 0 to 1)
// and read only after `state` is 2 (Release/Acquire), so accesses never race.
unsafe impl Sync for FirstError {}

impl FirstError {
    /// Records `r`'s error if it is the first.
    pub(crate) fn record(&self, r: Result<(), KdaError>) {
        let Err(e) = r else { return };
        if self
            .state
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            // SAFETY: only the thread that won the exchange above writes, and nobody reads
            // before `state` becomes 2.
            unsafe { *self.error.get() = Some(e) };
            self.state.store(2, Ordering::Release);
        }
    }

    /// The recorded error, once every task of the round has returned.
    pub(crate) fn take(&self) -> Result<(), KdaError> {
        if self.state.load(Ordering::Acquire) != 2 {
            return Ok(());
        }
        // SAFETY: `state` is 2: the single write has completed and happens-before this read.
        match unsafe { *self.error.get() } {
            Some(e) => Err(e),
            None => Ok(()),
        }
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
            assert!(s.slice("a", 2, 3).is_err());
            assert!(s.slice("a", usize::MAX, 2).is_err());
            assert_eq!(s.write("w", 4, 1.0), Err(KdaError::Internal { what: "w" }));
            assert!(s.write("w", 3, 1.0).is_ok());
            s.slice("a", 0, 2).unwrap()[1] = 2.0;
        }
        assert_eq!(v, [0.0, 2.0, 0.0, 1.0]);
    }

    #[test]
    fn first_error_keeps_the_first() {
        let f = FirstError::default();
        assert_eq!(f.take(), Ok(()));
        f.record(Ok(()));
        assert_eq!(f.take(), Ok(()));
        f.record(Err(KdaError::Internal { what: "one" }));
        f.record(Err(KdaError::Internal { what: "two" }));
        assert_eq!(f.take(), Err(KdaError::Internal { what: "one" }));
    }

    #[test]
    fn serial_runs_every_task_once_in_order() {
        let seen = std::sync::Mutex::new(std::vec::Vec::new());
        Serial.run(3, &|t, wk| seen.lock().unwrap().push((t, wk)));
        assert_eq!(*seen.lock().unwrap(), [(0, 0), (1, 0), (2, 0)]);
    }
}
