//! The core's error type: every rejected input names the argument and what was expected.

use core::fmt;

/// Everything the core can reject. Each variant names the offending argument, so a caller can
/// turn it into a message without knowing the call site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum KdaError {
    /// A slice has the wrong number of elements.
    Length {
        /// Name of the argument (e.g. `"q_proj.weight"`, `"workspace"`).
        arg: &'static str,
        /// Elements required.
        expected: usize,
        /// Elements given.
        actual: usize,
    },
    /// A slice is shorter than the minimum it needs (workspace, scratch).
    TooSmall {
        /// Name of the argument.
        arg: &'static str,
        /// Minimum number of elements.
        needed: usize,
        /// Elements given.
        actual: usize,
    },
    /// A matrix has the wrong shape.
    Shape {
        /// Name of the matrix.
        arg: &'static str,
        /// Expected `[rows, cols]`.
        expected: [usize; 2],
        /// Given `[rows, cols]`.
        actual: [usize; 2],
    },
    /// A configuration field is invalid.
    Config {
        /// Name of the field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The sequence offsets (`cu_seqlens`) are malformed.
    Offsets {
        /// What is wrong with them.
        reason: &'static str,
    },
    /// A weight is missing or of the wrong form for the configuration.
    Weights {
        /// Name of the weight.
        arg: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An internal consistency check failed (a bug in kda-core; please report it).
    Internal {
        /// What failed.
        what: &'static str,
    },
    /// A size computation overflowed `usize` (a configuration far too large for this target).
    Overflow {
        /// What was being sized.
        what: &'static str,
    },
}

impl fmt::Display for KdaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            KdaError::Length {
                arg,
                expected,
                actual,
            } => write!(f, "`{arg}` has {actual} elements, expected {expected}"),
            KdaError::TooSmall {
                arg,
                needed,
                actual,
            } => write!(f, "`{arg}` has {actual} elements, needs at least {needed}"),
            KdaError::Shape {
                arg,
                expected,
                actual,
            } => write!(
                f,
                "`{arg}` has shape [{}, {}], expected [{}, {}]",
                actual[0], actual[1], expected[0], expected[1]
            ),
            KdaError::Config { field, reason } => write!(f, "config `{field}`: {reason}"),
            KdaError::Offsets { reason } => write!(f, "`cu_seqlens`: {reason}"),
            KdaError::Weights { arg, reason } => write!(f, "weight `{arg}`: {reason}"),
            KdaError::Internal { what } => write!(f, "internal error: {what}"),
            KdaError::Overflow { what } => write!(f, "size of {what} overflows usize"),
        }
    }
}

impl core::error::Error for KdaError {}

/// `Ok(())` when `actual == expected`, else [`KdaError::Length`] naming `arg`.
pub(crate) fn check_len(arg: &'static str, actual: usize, expected: usize) -> Result<(), KdaError> {
    if actual == expected {
        Ok(())
    } else {
        Err(KdaError::Length {
            arg,
            expected,
            actual,
        })
    }
}

/// Checked `a * b`, naming what is being sized on overflow (the size arithmetic of every sizing
/// function; also used by other backends' sizing).
pub fn mul(what: &'static str, a: usize, b: usize) -> Result<usize, KdaError> {
    a.checked_mul(b).ok_or(KdaError::Overflow { what })
}

/// Checked `a + b`, naming what is being sized on overflow.
pub fn add(what: &'static str, a: usize, b: usize) -> Result<usize, KdaError> {
    a.checked_add(b).ok_or(KdaError::Overflow { what })
}

/// The number of rows of `width` in a slice of `len` elements; a [`KdaError::Length`] naming
/// `arg` when `len` is not a whole number of rows (or `width` is 0 and `len` is not).
pub(crate) fn rows_of(arg: &'static str, len: usize, width: usize) -> Result<usize, KdaError> {
    match len.checked_rem(width) {
        Some(0) => Ok(len / width),
        Some(rem) => Err(KdaError::Length {
            arg,
            expected: len - rem,
            actual: len,
        }),
        None if len == 0 => Ok(0),
        None => Err(KdaError::Length {
            arg,
            expected: 0,
            actual: len,
        }),
    }
}
