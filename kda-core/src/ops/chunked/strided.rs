//! The views [`chunked_head_strided`](super::chunked_head_strided) reads and hints with: rows
//! at a fixed distance in a larger buffer ([`StridedRows`]), one head's five inputs
//! ([`StridedInputs`]) with its state ([`StridedHead`]), and where the caller puts the outputs
//! ([`RowsHint`], for prefetching only).

use crate::error::KdaError;
use crate::simd::{self, RowQueue};

/// Rows of `dim` elements at a fixed distance in a larger row-major buffer: row `t` is
/// `data[t·stride..t·stride + dim]`. One head `h` of a `[T, H, D]` tensor `x` is
/// `StridedRows { data: &x[h·D..], dim: D, stride: H·D }`; contiguous `[T, D]` rows have
/// `stride == dim`.
#[derive(Debug, Clone, Copy)]
pub struct StridedRows<'a> {
    /// The buffer; row 0 starts at its first element.
    pub data: &'a [f32],
    /// Elements per row (≥ 1).
    pub dim: usize,
    /// Elements from the start of one row to the start of the next (≥ `dim`).
    pub stride: usize,
}

impl<'a> StridedRows<'a> {
    /// Contiguous rows of `dim` elements.
    pub fn contiguous(data: &'a [f32], dim: usize) -> Self {
        StridedRows {
            data,
            dim,
            stride: dim,
        }
    }

    /// Hints the caches to fetch the first `rows` rows (those that fit in `data`): for a
    /// caller that knows which rows the kernel reads next. Rows a page or more apart (one head
    /// of a `[T, H, K]` tensor) are beyond the reach of the hardware prefetchers.
    pub fn prefetch(&self, rows: usize) {
        for i in 0..rows {
            match self
                .data
                .get(i * self.stride..)
                .and_then(|r| r.get(..self.dim))
            {
                Some(row) => simd::prefetch(row),
                None => break,
            }
        }
    }

    /// Checks that `rows` rows of `dim` elements fit; `arg` names the argument in the error.
    pub(super) fn check(&self, arg: &'static str, rows: usize, dim: usize) -> Result<(), KdaError> {
        if self.dim != dim || dim == 0 {
            return Err(KdaError::Shape {
                arg,
                expected: [rows, dim],
                actual: [rows, self.dim],
            });
        }
        if self.stride < self.dim {
            return Err(KdaError::Config {
                field: "stride",
                reason: "must be at least the row length",
            });
        }
        let needed = match rows.checked_sub(1) {
            None => 0,
            Some(last) => last
                .checked_mul(self.stride)
                .and_then(|v| v.checked_add(dim))
                .ok_or(KdaError::Overflow { what: arg })?,
        };
        if self.data.len() < needed {
            return Err(KdaError::TooSmall {
                arg,
                needed,
                actual: self.data.len(),
            });
        }
        Ok(())
    }

    /// Row `i` (checked against `data`'s length).
    #[inline(always)]
    pub(super) fn row(&self, i: usize) -> &'a [f32] {
        &self.data[i * self.stride..][..self.dim]
    }

    /// The first element of row `i`.
    #[inline(always)]
    pub(super) fn at(&self, i: usize) -> f32 {
        self.data[i * self.stride]
    }

    /// The rows from row `i` on.
    #[inline(always)]
    pub(super) fn skip_rows(&self, i: usize) -> Self {
        StridedRows {
            data: &self.data[(i * self.stride).min(self.data.len())..],
            ..*self
        }
    }
}

/// One head of one sequence read in place out of larger tensors (for example `[T, H, K]`
/// inputs), with its state: what [`chunked_head_strided`](super::chunked_head_strided) runs.
#[derive(Debug)]
pub struct StridedHead<'a> {
    /// The input rows.
    pub inputs: StridedInputs<'a>,
    /// `[K, V]` K-first state: initial in, final out.
    pub state: &'a mut [f32],
    /// The query scale.
    pub scale: f32,
    /// Input rows the caller runs next (for example the next head's), which the kernel
    /// prefetches a row at a time during its last chunk: rows a page apart (one head of
    /// `[T, H, K]` tensors) are beyond the reach of the hardware prefetchers, and one burst of
    /// prefetches for all of them is mostly dropped by some cores (PERFORMANCE.md, 2026-12-04,
    /// Zen 4, 6cea1b2). `None` if nothing follows or the caller fetches them itself.
    pub next: Option<StridedInputs<'a>>,
    /// Where the caller's `out` puts the outputs, if it copies them to rows of memory: the
    /// kernel prefetches each chunk's destination rows while it computes the chunk, so that
    /// the copy does not wait for them (the rows of one head of a `[T, H, V]` output are a
    /// page or more apart, and a 64 MiB output is not in any cache: the copy took ~6 % of a
    /// call on Zen 4, PERFORMANCE.md, 2026-12-05, 23e9b4b). `None` if unknown.
    pub out_rows: Option<RowsHint>,
}

/// Where rows of `f32` lie, for prefetching only: row `t` (`dim` elements) starts at the
/// address `start + 4·t·stride`. Nothing is read or written through it, so any value is safe;
/// a wrong one costs only wasted prefetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowsHint {
    /// The address of row 0's first element.
    pub start: usize,
    /// Elements per row.
    pub dim: usize,
    /// Elements from the start of one row to the start of the next.
    pub stride: usize,
}

impl RowsHint {
    /// The hint for the rows of `rows` (its first element's address, its `dim` and `stride`).
    pub fn of(rows: &[f32], dim: usize, stride: usize) -> Self {
        RowsHint {
            start: rows.as_ptr() as usize,
            dim,
            stride,
        }
    }

    /// The address of row `t`'s first element (wrapping: only an address to hint).
    pub fn row_start(&self, t: usize) -> usize {
        self.start
            .wrapping_add(t.wrapping_mul(self.stride).wrapping_mul(4))
    }
}

/// The input rows of one head of one sequence, read in place: `tokens` rows each; `q`, `k`,
/// `g` rows of `K`, `beta` rows of 1, `v` rows of `V`.
#[derive(Debug, Clone, Copy)]
pub struct StridedInputs<'a> {
    /// Tokens `T`.
    pub tokens: usize,
    /// Queries (L2-normalised).
    pub q: StridedRows<'a>,
    /// Keys (L2-normalised).
    pub k: StridedRows<'a>,
    /// Log-decays (≤ 0).
    pub g: StridedRows<'a>,
    /// Write strengths (`dim` 1).
    pub beta: StridedRows<'a>,
    /// Values.
    pub v: StridedRows<'a>,
}

impl<'a> StridedInputs<'a> {
    /// The five inputs in the order the kernel reads them.
    pub(super) fn sets(&self) -> [StridedRows<'a>; 5] {
        [self.q, self.k, self.g, self.beta, self.v]
    }

    /// Appends the rows to `queue`, to prefetch a row at a time.
    pub(super) fn enqueue(&self, queue: &mut RowQueue<'a>) {
        for x in self.sets() {
            queue.push(x.data, (self.tokens, x.dim, x.stride));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefetch hint past the end of the rows stops at the last row that fits.
    #[test]
    fn prefetch_stays_inside_the_rows() {
        let x = [1.0f32; 10];
        let rows = StridedRows {
            data: &x[2..],
            dim: 3,
            stride: 4,
        };
        rows.prefetch(100);
        StridedRows::contiguous(&[], 1).prefetch(3);
    }
}
