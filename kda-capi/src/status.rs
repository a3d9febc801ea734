//! Status codes: one per [`KdaError`] variant, plus the checks of the C boundary.

use core::ffi::c_char;

use kda_core::KdaError;

/// What a call returned. `KDA_STATUS_OK` (0) is success; every other value names the kind of
/// problem, and [`kda_status_message`] gives a sentence for it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdaStatus {
    /// Success.
    Ok = 0,
    /// A buffer has the wrong number of elements (kda-core `Length`).
    Length = 1,
    /// A buffer (workspace, parameters) is shorter than its size function says (`TooSmall`).
    TooSmall = 2,
    /// A matrix has the wrong shape for the config (`Shape`). Not returned by this interface,
    /// which takes every shape from the config (a wrongly sized matrix is
    /// `KDA_STATUS_LENGTH`); kept so kda-core's errors map one to one.
    Shape = 3,
    /// A config or option field is invalid (`Config`).
    Config = 4,
    /// The sequence offsets `cu_seqlens` are malformed (`Offsets`).
    Offsets = 5,
    /// A weight is missing, of an unknown dtype or layout, or of the wrong form (`Weights`).
    Weights = 6,
    /// An internal consistency check of kda-core failed: a bug, please report it (`Internal`).
    Internal = 7,
    /// A size computation overflowed `size_t` (`Overflow`).
    Overflow = 8,
    /// A required pointer is NULL (or NULL with a non-zero length).
    NullPointer = 9,
    /// A pointer is not aligned for its element type (4 bytes for float and int32, 2 for
    /// bf16 / f16, 8 for the layer handles).
    BadAlignment = 10,
    /// A writable buffer overlaps another buffer of the same call.
    Overlap = 11,
    /// The layer handle was not initialised by a successful `kda_layer_init` /
    /// `kda_fixed_init`.
    BadHandle = 12,
    /// A panic inside the library was caught (host builds with the `std` feature only; it
    /// would be a bug, please report it).
    Panic = 13,
}

impl From<KdaError> for KdaStatus {
    fn from(e: KdaError) -> Self {
        match e {
            KdaError::Length { .. } => KdaStatus::Length,
            KdaError::TooSmall { .. } => KdaStatus::TooSmall,
            KdaError::Shape { .. } => KdaStatus::Shape,
            KdaError::Config { .. } => KdaStatus::Config,
            KdaError::Offsets { .. } => KdaStatus::Offsets,
            KdaError::Weights { .. } => KdaStatus::Weights,
            KdaError::Internal { .. } => KdaStatus::Internal,
            KdaError::Overflow { .. } => KdaStatus::Overflow,
        }
    }
}

/// Why a call failed: the status, and kda-core's error when it came from there (for
/// `kda_layer_explain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fail {
    pub(crate) status: KdaStatus,
    pub(crate) error: Option<KdaError>,
}

impl From<KdaStatus> for Fail {
    fn from(status: KdaStatus) -> Self {
        Fail {
            status,
            error: None,
        }
    }
}

impl From<KdaError> for Fail {
    fn from(e: KdaError) -> Self {
        Fail {
            status: e.into(),
            error: Some(e),
        }
    }
}

/// A call's result inside the crate.
pub(crate) type Res<T = ()> = Result<T, Fail>;

/// Turns a `Res` into the status returned over the boundary.
pub(crate) fn status(r: Res) -> KdaStatus {
    match r {
        Ok(()) => KdaStatus::Ok,
        Err(f) => f.status,
    }
}

/// Runs an entry point's body; with `std`, a panic becomes [`KdaStatus::Panic`].
pub(crate) fn guard(f: impl FnOnce() -> Res) -> KdaStatus {
    #[cfg(feature = "std")]
    {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_or(KdaStatus::Panic, status)
    }
    #[cfg(not(feature = "std"))]
    {
        status(f())
    }
}

/// A static, NUL-terminated English sentence for a status `code` (any `int`: unknown codes get
/// "unknown status code"). The string is owned by the library and lives forever; do not free it.
#[no_mangle]
pub extern "C" fn kda_status_message(code: i32) -> *const c_char {
    message(code).as_ptr()
}

impl KdaStatus {
    /// The C value of the status.
    pub(crate) fn code(self) -> i32 {
        #[allow(clippy::as_conversions)] // a fieldless `repr(C)` enum: lossless
        let c = self as i32;
        c
    }
}

/// The sentence for a status code.
pub(crate) fn message(code: i32) -> &'static core::ffi::CStr {
    match code {
        0 => c"success",
        1 => c"a buffer has the wrong number of elements",
        2 => c"a buffer is smaller than its size function requires",
        3 => c"a weight matrix has the wrong shape for the config",
        4 => c"invalid config or option field",
        5 => c"malformed sequence offsets (cu_seqlens)",
        6 => c"a weight is missing, of an unknown dtype or layout, or of the wrong form",
        7 => c"internal error in kda-core (a bug; please report it)",
        8 => c"a size computation overflows size_t",
        9 => c"a required pointer is NULL",
        10 => c"a pointer is not aligned for its element type",
        11 => c"a writable buffer overlaps another buffer of the call",
        12 => c"the layer handle is not initialised",
        13 => c"a panic was caught inside the library (a bug; please report it)",
        _ => c"unknown status code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_status_and_message() {
        let errors = [
            (
                KdaError::Length {
                    arg: "a",
                    expected: 1,
                    actual: 2,
                },
                KdaStatus::Length,
            ),
            (
                KdaError::TooSmall {
                    arg: "a",
                    needed: 1,
                    actual: 0,
                },
                KdaStatus::TooSmall,
            ),
            (
                KdaError::Shape {
                    arg: "a",
                    expected: [1, 1],
                    actual: [1, 2],
                },
                KdaStatus::Shape,
            ),
            (
                KdaError::Config {
                    field: "a",
                    reason: "b",
                },
                KdaStatus::Config,
            ),
            (KdaError::Offsets { reason: "b" }, KdaStatus::Offsets),
            (
                KdaError::Weights {
                    arg: "a",
                    reason: "b",
                },
                KdaStatus::Weights,
            ),
            (KdaError::Internal { what: "a" }, KdaStatus::Internal),
            (KdaError::Overflow { what: "a" }, KdaStatus::Overflow),
        ];
        for (e, s) in errors {
            assert_eq!(KdaStatus::from(e), s);
            assert_eq!(Fail::from(e).error, Some(e));
        }
        for code in 0..=KdaStatus::Panic.code() {
            assert_ne!(message(code), c"unknown status code", "{code}");
        }
        assert_eq!(message(-1), c"unknown status code");
        assert_eq!(message(KdaStatus::Panic.code() + 1), c"unknown status code");
    }

    #[cfg(feature = "std")]
    #[test]
    #[allow(clippy::panic)]
    fn a_panic_becomes_a_status() {
        assert_eq!(guard(|| panic!("test panic")), KdaStatus::Panic);
        assert_eq!(guard(|| Ok(())), KdaStatus::Ok);
        assert_eq!(guard(|| Err(KdaStatus::Overlap.into())), KdaStatus::Overlap);
    }
}
