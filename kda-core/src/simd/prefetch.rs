//! Cache hints: [`prefetch`] of a slice, one line at a time for the kernels, and the
//! [`RowQueue`] that spreads the prefetches of rows out over other work, and their tests.

/// Hints the cache line at `p` into L2 (x86-64; nothing elsewhere). Never faults.
#[inline(always)]
pub(crate) fn prefetch_line<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` (SSE, baseline on x86-64) only hints the cache and never faults,
    // whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints the CPU to bring `data` into its outer caches (one prefetch per 64-byte line), so
/// a later pass finds it there; does nothing on other architectures. Never faults.
#[inline]
pub fn prefetch<T>(data: &[T]) {
    prefetch_lines(data)
}

/// [`prefetch`], always inlined (for the inner loops of kernels): one prefetch per line that
/// `data` touches ([`line_starts`]), so that a row that does not start on a line boundary (a
/// numpy array's, 16-byte aligned) is fetched whole.
#[inline(always)]
fn prefetch_lines<T>(data: &[T]) {
    prefetch_span(data.as_ptr() as usize, core::mem::size_of_val(data))
}

/// One prefetch per line that `bytes` bytes from the address `addr` touch. Only hints: the
/// address need not be valid.
#[inline(always)]
fn prefetch_span(addr: usize, bytes: usize) {
    for line in line_starts(addr, bytes) {
        prefetch_line(line as *const u8);
    }
}

/// The addresses of the cache lines that `bytes` bytes from `addr` touch: from the line of the
/// first byte to the line of the last, each once (none for 0 bytes).
#[inline(always)]
pub(super) fn line_starts(addr: usize, bytes: usize) -> impl Iterator<Item = usize> {
    let first = addr - addr % LINE_BYTES;
    let end = if bytes == 0 {
        first
    } else {
        addr.saturating_add(bytes)
    };
    (first..end).step_by(LINE_BYTES)
}

/// Bytes per cache line: one prefetch each.
const LINE_BYTES: usize = 64;

/// Sets of rows a [`RowQueue`] holds at most: a chunk's five inputs and one set of output
/// rows.
pub(crate) const QUEUE_SETS: usize = 6;

/// Rows of some inputs to prefetch one row at a time while other work runs, paced by that
/// work ([`RowQueue::work`], which the chunk GEMMs call as they go): the next head's or the
/// next chunk's rows of `[T, H, K]` tensors, which are a page apart and beyond the reach of the
/// hardware prefetchers, and the rows a chunk's outputs go to ([`RowQueue::push_hint`]).
/// Spread out instead of issued in one burst because a Zen 4 core keeps only the first 16 to 32
/// prefetches of a burst (PERFORMANCE.md, 2026-12-04, 6cea1b2). Prefetching never faults, so a row
/// that is not read after all costs only a wasted hint.
pub(crate) struct RowQueue<'a> {
    /// The sets of rows, fetched in order.
    sets: [QueuedRows; QUEUE_SETS],
    /// Sets in use.
    len: usize,
    /// The next row to fetch: `(set, row)`.
    next: core::cell::Cell<(usize, usize)>,
    /// Multiply-adds done since the last row was fetched ([`RowQueue::work`]).
    credit: core::cell::Cell<usize>,
    /// The slices that [`RowQueue::push`] took rows of.
    _rows: core::marker::PhantomData<&'a [f32]>,
}

/// Multiply-adds of other work per row a [`RowQueue`] fetches: about 0.15 µs on a Zen 4 core,
/// so that the 96 rows of a chunk of 16 (the next chunk's 80 input rows, this one's 16 output
/// rows) arrive over its ~880 k multiply-adds.
const WORK_PER_ROW: usize = 8192;

/// Rows one [`RowQueue::work`] call fetches at most (the rest of its credit carries over).
const MAX_ROWS_AT_ONCE: usize = 2;

/// One set of a [`RowQueue`]: `rows` rows of `dim` f32, `stride` elements apart, from the
/// address `start` (only prefetched, never read).
#[derive(Clone, Copy)]
struct QueuedRows {
    start: usize,
    rows: usize,
    dim: usize,
    stride: usize,
}

impl<'a> RowQueue<'a> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        let none = QueuedRows {
            start: 0,
            rows: 0,
            dim: 0,
            stride: 0,
        };
        RowQueue {
            sets: [none; QUEUE_SETS],
            len: 0,
            next: core::cell::Cell::new((0, 0)),
            credit: core::cell::Cell::new(0),
            _rows: core::marker::PhantomData,
        }
    }

    /// Appends `rows` rows of `dim` elements, `stride` apart from the start of `data` (rows
    /// that do not fit in `data` are left out); ignored once [`QUEUE_SETS`] sets are queued.
    pub(crate) fn push(&mut self, data: &'a [f32], (rows, dim, stride): (usize, usize, usize)) {
        let stride = stride.max(dim).max(1);
        let fit = match data.len().checked_sub(dim) {
            Some(room) if dim > 0 => room / stride + 1,
            _ => 0,
        };
        self.push_hint(data.as_ptr() as usize, (rows.min(fit), dim, stride));
    }

    /// Appends `rows` rows of `dim` f32, `stride` elements apart, from the address `start`:
    /// memory that other code writes meanwhile (a chunk's output rows), named by address only,
    /// since prefetching reads nothing; ignored once [`QUEUE_SETS`] sets are queued.
    pub(crate) fn push_hint(&mut self, start: usize, (rows, dim, stride): (usize, usize, usize)) {
        if self.len < QUEUE_SETS {
            self.sets[self.len] = QueuedRows {
                start,
                rows,
                dim,
                stride,
            };
            self.len += 1;
        }
    }

    /// The next queued row, as its address and size in bytes (and moves past it), or `None`
    /// when none is left.
    #[inline(always)]
    fn take(&self) -> Option<(usize, usize)> {
        let (mut set, mut row) = self.next.get();
        while set < self.len && row >= self.sets[set].rows {
            (set, row) = (set + 1, 0);
        }
        let q = self.sets[..self.len].get(set)?;
        self.next.set((set, row + 1));
        let offset = row.wrapping_mul(q.stride).wrapping_mul(4);
        Some((q.start.wrapping_add(offset), q.dim.wrapping_mul(4)))
    }

    /// Counts `fmas` multiply-adds of other work and hints a row into L2 per
    /// [`WORK_PER_ROW`] of them (one prefetch per 64-byte line). Inlined whole: a call
    /// inside a GEMM register block would spill its accumulators.
    #[inline(always)]
    pub(crate) fn work(&self, fmas: usize) {
        let mut credit = self.credit.get() + fmas;
        for _ in 0..MAX_ROWS_AT_ONCE {
            if credit < WORK_PER_ROW {
                break;
            }
            credit -= WORK_PER_ROW;
            match self.take() {
                Some((start, bytes)) => prefetch_span(start, bytes),
                None => credit = 0,
            }
        }
        self.credit.set(credit);
    }

    /// Hints every row still queued.
    pub(crate) fn drain(&self) {
        while let Some((start, bytes)) = self.take() {
            prefetch_span(start, bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// `prefetch` hints every line a slice touches, once: a row that starts inside a line
    /// (numpy's 16-byte alignment) ends in one more line than an aligned one.
    #[test]
    fn line_starts_cover_every_touched_line_once() {
        for addr in 0..200usize {
            for bytes in 0..300usize {
                let got: std::vec::Vec<usize> = line_starts(addr, bytes).collect();
                let want: std::vec::Vec<usize> = if bytes == 0 {
                    std::vec![]
                } else {
                    (addr / 64..=(addr + bytes - 1) / 64)
                        .map(|l| l * 64)
                        .collect()
                };
                assert_eq!(got, want, "addr {addr} bytes {bytes}");
            }
        }
        // 512 bytes (a row of 128 f32): 8 lines aligned, 9 from 16 bytes in.
        assert_eq!(line_starts(4096, 512).count(), 8);
        assert_eq!(line_starts(4096 + 16, 512).count(), 9);
    }

    #[test]
    fn row_queue_hands_out_the_rows_that_fit_in_order() {
        let buf: Vec<f32> = (0..40).map(|i| i as f32).collect();
        let mut q = RowQueue::new();
        // A hint first: 2 rows of 3, 5 apart, from element 30 (any address is taken as is).
        let base = buf.as_ptr() as usize;
        q.push_hint(base + 30 * 4, (2, 3, 5));
        // 5 rows of 3, 4 apart, in buf[0..10]: only rows 0 and 1 fit (row 2 would end at 11).
        q.push(&buf[..10], (5, 3, 4));
        // 2 contiguous rows of 2 from 20.
        q.push(&buf[20..], (2, 2, 2));
        // Empty and zero-width sets hand out nothing.
        q.push(&[], (3, 4, 4));
        q.push(&buf, (3, 0, 1));
        // (first element, elements) of each row handed out.
        let rows: Vec<(usize, usize)> = core::iter::from_fn(|| q.take())
            .map(|(start, bytes)| ((start - base) / 4, bytes / 4))
            .collect();
        assert_eq!(rows, [(30, 3), (35, 3), (0, 3), (4, 3), (20, 2), (22, 2)]);
        assert!(q.take().is_none());
    }

    #[test]
    fn row_queue_keeps_at_most_its_sets_and_paces_by_work() {
        let buf = vec![0.0f32; 64];
        let mut q = RowQueue::new();
        for _ in 0..QUEUE_SETS + 2 {
            q.push(&buf, (4, 8, 16));
        }
        // Each set holds 4 rows; the sets past QUEUE_SETS were ignored.
        q.work(3 * WORK_PER_ROW - 1);
        let left = |q: &RowQueue<'_>| core::iter::from_fn(|| q.take()).count();
        // Two rows went (the third is one multiply-add short); the credit carries over.
        let mut p = RowQueue::new();
        for _ in 0..QUEUE_SETS {
            p.push(&buf, (4, 8, 16));
        }
        p.work(3 * WORK_PER_ROW - 1);
        p.work(1);
        assert_eq!(left(&q), 4 * QUEUE_SETS - 2);
        assert_eq!(left(&p), 4 * QUEUE_SETS - 3);
        // An exhausted queue takes any amount of work.
        p.work(usize::MAX / 2);
        p.drain();
        assert!(p.take().is_none());
    }
}
