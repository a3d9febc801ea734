//! The inner loops every kernel is built from: one set of kernels written over a small vector
//! abstraction (`vector.rs`), instantiated per instruction set and chosen at run time (RustFFT
//! style). The kernels are in one file per family:
//!
//! | file | what |
//! |---|---|
//! | `gemm.rs` | the chunked form's small GEMM ([`gemm()`], [`CStart`]), row blocks, short `k` |
//! | `proj/prefill.rs` | the prefill projection GEMMs: packed or panel-layout panels, bf16 pairs |
//! | `proj/decode.rs` | decode: bf16 panels or weight rows streamed for a few tokens |
//! | `proj/mod.rs` | what prefill and decode share ([`Rows`], [`PairSteps`], kernel parts), input rounding |
//! | `chunk.rs` | a tame chunk's row factors ([`tame_rows`]) and the transposes |
//! | `elementwise.rs` | `exp` and what is built on it: sigmoid, softplus, SiLU |
//! | `recurrence.rs` | the recurrence's row passes and `axpy` |
//! | `conv.rs` | the short causal conv + SiLU |
//! | `probes.rs` | the benchmarks' FMA-peak and read-bandwidth probes |
//! | `prefetch.rs` | cache hints and the [`RowQueue`] that paces them (no kernels) |
//!
//! Each holds its safe wrappers (every length checked, a bad slice an internal error), their
//! `dispatch!`, a `kernels` module with the generic kernels (`#[inline(always)]`, over
//! `S: Simd`) and their `entry_points!`, one `instantiate!()` line that makes those entry
//! points for every ISA token, and the family's tests (`test_support.rs` has what the tests
//! share). A kernel's contract: its caller (the safe wrapper) has checked the slice lengths,
//! and the token proves the CPU has the ISA; all pointer offsets stay within the checked
//! lengths. `types.rs` holds the types and constants the wrappers, the kernels and the
//! reference loops share.
//!
//! * [`Isa::Portable`]: the reference loops of `portable.rs` (plain Rust the compiler
//!   vectorises for the baseline target; runs everywhere, Cortex-M included). They define the
//!   results every other path is tested against.
//! * [`Isa::Avx2Fma`] (`avx2.rs`), [`Isa::Avx512F`] and [`Isa::Avx512Bf16`] (`avx512.rs`),
//!   [`Isa::Neon`] (`neon.rs`): the mapping of the vector trait to that ISA, a token type;
//!   each kernel file instantiates its generic kernels over it, inside `#[target_feature]`
//!   entry points (`instantiate!`, one per kernel and ISA).
//!   x86 detection is at run time with the `std` feature, else at compile time
//!   (`-C target-feature=…`); NEON is part of every aarch64 target.
//! * In tests, the same generic kernels instantiated over plain `[f32; N]` lanes (`lanes.rs`)
//!   at N = 4, 8 and 16, checked bitwise against the reference loops: every width-dependent
//!   part (tiles, blocks, tails) is exercised at every ISA's width on any machine. Each
//!   kernel accumulates every output as one chain in the reference loops' order, so with
//!   plain lanes (multiply then add) it gives their results bitwise at any width; an ISA with
//!   FMA differs from them only by the fused rounding (and `exp`). Each ISA's operations are
//!   checked against plain lanes in `vector_tests.rs`.
//!
//! Imports go one way: `vector.rs` ← the ISA mappings ← this file (whose macros name the
//! tokens) ← the kernel files, and `types.rs` ← `portable.rs` ← the kernel files; no kernel
//! file is used by a lower one.
//!
//! Adding an ISA: one file with its `Simd` impl, its module in `instantiate!`, its arm in
//! [`Isa`] and `dispatch!`. Adding a kernel: its generic form, entry point, safe wrapper and
//! tests in its family's file, its reference loop in `portable.rs`.
//!
//! Every function here gives the same answer, bitwise, for any split of the work across calls
//! or threads; the paths differ from each other only by rounding (FMA vs separate multiply and
//! add; the vector `exp` is within 2 ulp of `libm`). Each fast path is tested against the
//! portable one in its family's tests.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod lanes;
#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
#[cfg(test)]
mod test_support;
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
mod vector;

mod blocks;
mod chunk;
mod conv;
mod elementwise;
mod gemm;
mod prefetch;
mod probes;
mod proj;
mod recurrence;
mod types;
#[cfg(test)]
mod vector_tests;

pub use blocks::dot_q8_0;
pub(crate) use chunk::transpose_scaled;
pub use chunk::{tame_rows, transpose};
pub use conv::short_conv;
pub use elementwise::{exp_in_place, sigmoid_scaled, softplus_scaled};
pub use gemm::{gemm, gemm_acc};
pub(crate) use gemm::{gemm_queued, short_gemm};
pub use prefetch::prefetch;
pub(crate) use prefetch::RowQueue;
pub use probes::{dot_pairs_peak, fma_peak, read_sum};
pub use proj::{
    pack_panel, pairs_panel_fma, pairs_panels_fma, panel_fma, panel_fma_bf16, panels_fma,
    round_pairs_row, rows_fma, PairSteps, Rows,
};
pub use recurrence::{
    axpy, decay_predict, decay_predict_rows, decay_predict_rows_from, write_read_rows,
};
#[cfg(test)]
pub(crate) use test_support::test_paths;
pub use types::{CStart, ReadLoads, TameIn, TameOut, DECODE_LD, DECODE_PANELS, DIRECT, PANEL};

use crate::error::KdaError;

/// An instruction-set path for the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Isa {
    /// Portable Rust (auto-vectorised for the compile target).
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2Fma,
    /// x86-64 with AVX-512F (and AVX2, FMA): 16 lanes, 32 registers.
    Avx512F,
    /// [`Isa::Avx512F`] plus AVX512BW and AVX512_BF16: the same f32 kernels, and native bf16
    /// dot products (`vdpbf16ps`) for the bf16 precision mode.
    Avx512Bf16,
    /// aarch64 Advanced SIMD (NEON): 4 lanes, 32 registers.
    Neon,
}

impl Isa {
    /// Every path, the portable one first; on one CPU each later one it supports is faster
    /// than the earlier ones (NEON and the x86 paths never coexist).
    const ALL: [Isa; 5] = [
        Isa::Portable,
        Isa::Avx2Fma,
        Isa::Avx512F,
        Isa::Avx512Bf16,
        Isa::Neon,
    ];

    /// The fastest path this CPU supports.
    pub fn detect() -> Isa {
        Isa::all_supported().last().unwrap_or(Isa::Portable)
    }

    /// Whether this CPU can run the path.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            Isa::Avx2Fma => avx2_fma_supported(),
            Isa::Avx512F => avx512_supported(),
            Isa::Avx512Bf16 => avx512_bf16_supported(),
            Isa::Neon => cfg!(target_arch = "aarch64"),
        }
    }

    /// Every path this CPU supports (for tests and benchmarks), the portable one first.
    pub fn all_supported() -> impl Iterator<Item = Isa> {
        Isa::all().filter_map(|(i, ok)| ok.then_some(i))
    }

    /// Every path this build knows, with whether this CPU runs it (for "skipped: no …" lines).
    pub fn all() -> impl Iterator<Item = (Isa, bool)> {
        Isa::ALL.into_iter().map(|i| (i, i.is_supported()))
    }

    /// A short lower-case name (`portable`, `avx2`, `avx512f`, `avx512bf16`, `neon`), as
    /// printed by benches.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2Fma => "avx2",
            Isa::Avx512F => "avx512f",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Neon => "neon",
        }
    }

    /// The CPU feature the path needs, as `/proc/cpuinfo` spells it (for "skipped: no …").
    pub fn feature(self) -> &'static str {
        match self {
            Isa::Portable => "nothing",
            Isa::Avx2Fma => "avx2+fma",
            Isa::Avx512F => "avx512f",
            Isa::Avx512Bf16 => "avx512_bf16",
            Isa::Neon => "neon (aarch64)",
        }
    }
}

#[cfg(all(target_arch = "x86_64", any(feature = "std", test)))]
fn avx2_fma_supported() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

#[cfg(all(target_arch = "x86_64", not(any(feature = "std", test))))]
fn avx2_fma_supported() -> bool {
    cfg!(all(target_feature = "avx2", target_feature = "fma"))
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_fma_supported() -> bool {
    false
}

#[cfg(all(target_arch = "x86_64", any(feature = "std", test)))]
fn avx512_supported() -> bool {
    std::is_x86_feature_detected!("avx512f") && avx2_fma_supported()
}

#[cfg(all(target_arch = "x86_64", not(any(feature = "std", test))))]
fn avx512_supported() -> bool {
    cfg!(all(
        target_feature = "avx512f",
        target_feature = "avx2",
        target_feature = "fma"
    ))
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_supported() -> bool {
    false
}

#[cfg(all(target_arch = "x86_64", any(feature = "std", test)))]
fn avx512_bf16_supported() -> bool {
    avx512_supported()
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512bf16")
}

#[cfg(all(target_arch = "x86_64", not(any(feature = "std", test))))]
fn avx512_bf16_supported() -> bool {
    avx512_supported()
        && cfg!(all(
            target_feature = "avx512bw",
            target_feature = "avx512bf16"
        ))
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_bf16_supported() -> bool {
    false
}

/// Which implementation a call runs: an [`Isa`], or (in tests) the generic kernels over
/// plain lanes of a given width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// The reference loops (`portable.rs`).
    Reference,
    /// The generic kernels on AVX2 + FMA.
    Avx2,
    /// The generic kernels on AVX-512F.
    Avx512,
    /// The generic kernels on AVX-512F with AVX512BW and AVX512_BF16.
    Avx512Bf16,
    /// The generic kernels on NEON.
    Neon,
    /// The generic kernels over `[f32; N]` lanes.
    #[cfg(test)]
    Lanes(usize),
}

impl From<Isa> for Path {
    fn from(isa: Isa) -> Path {
        match isa {
            Isa::Portable => Path::Reference,
            Isa::Avx2Fma => Path::Avx2,
            Isa::Avx512F => Path::Avx512,
            Isa::Avx512Bf16 => Path::Avx512Bf16,
            Isa::Neon => Path::Neon,
        }
    }
}

/// Runs kernel `$name` on `$path`: the calling file's entry point for the ISA (made there by
/// `instantiate!`) when asked for and the CPU has it, else the reference `$reference`; in
/// tests, a plain-lanes entry point of the calling file.
macro_rules! dispatch {
    ($path:expr, $name:ident ( $($arg:expr),* ), $reference:expr) => {{
        let path: $crate::simd::Path = $path.into();
        match path {
            // SAFETY: the CPU has the ISA (checked in the guard), the only requirement of the
            // entry points beyond the slice lengths the safe wrappers have checked.
            #[cfg(target_arch = "x86_64")]
            $crate::simd::Path::Avx512Bf16 if $crate::simd::avx512_bf16_supported() => unsafe {
                avx512_bf16::$name($($arg),*)
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            $crate::simd::Path::Avx512 if $crate::simd::avx512_supported() => unsafe {
                avx512::$name($($arg),*)
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            $crate::simd::Path::Avx2 if $crate::simd::avx2_fma_supported() => unsafe {
                avx2::$name($($arg),*)
            },
            // SAFETY: NEON is part of every aarch64 target; lengths checked by the wrappers.
            #[cfg(target_arch = "aarch64")]
            $crate::simd::Path::Neon => unsafe { neon::$name($($arg),*) },
            // SAFETY: plain Rust; lengths checked by the wrappers.
            #[cfg(test)]
            $crate::simd::Path::Lanes(4) => unsafe { lanes4::$name($($arg),*) },
            // SAFETY: as above.
            #[cfg(test)]
            $crate::simd::Path::Lanes(8) => unsafe { lanes8::$name($($arg),*) },
            // SAFETY: as above.
            #[cfg(test)]
            $crate::simd::Path::Lanes(16) => unsafe { lanes16::$name($($arg),*) },
            _ => $reference,
        }
    }};
}
pub(crate) use dispatch;

/// Makes, in the invoking kernel file, one module of entry points per ISA token (`avx2`,
/// `avx512`, `avx512_bf16`, `neon`; in tests `lanes4`, `lanes8`, `lanes16`), each the file's
/// `kernels::entry_points!` for that token with `#[target_feature(enable = …)]` (none for
/// plain lanes): what the file's `dispatch!` calls. Their contract is that of the kernels:
/// lengths checked by the caller, and the CPU has the features.
macro_rules! instantiate {
    () => {
        /// The kernels' entry points on AVX2 + FMA.
        #[cfg(target_arch = "x86_64")]
        mod avx2 {
            super::kernels::entry_points!($crate::simd::avx2::Avx2::new_unchecked(), "avx2,fma");
        }
        /// The kernels' entry points on AVX-512F.
        #[cfg(target_arch = "x86_64")]
        mod avx512 {
            super::kernels::entry_points!(
                $crate::simd::avx512::Avx512::<false>::new_unchecked(),
                "avx512f,avx2,fma"
            );
        }
        /// The kernels' entry points on AVX-512F with AVX512BW and AVX512_BF16.
        #[cfg(target_arch = "x86_64")]
        mod avx512_bf16 {
            super::kernels::entry_points!(
                $crate::simd::avx512::Avx512::<true>::new_unchecked(),
                "avx512f,avx512bw,avx512bf16,avx2,fma"
            );
        }
        /// The kernels' entry points on NEON.
        #[cfg(target_arch = "aarch64")]
        mod neon {
            super::kernels::entry_points!($crate::simd::neon::Neon::new_unchecked(), "neon");
        }
        /// The kernels over 4 plain lanes.
        #[cfg(test)]
        mod lanes4 {
            super::kernels::entry_points!($crate::simd::lanes::Lanes::<4>);
        }
        /// The kernels over 8 plain lanes.
        #[cfg(test)]
        mod lanes8 {
            super::kernels::entry_points!($crate::simd::lanes::Lanes::<8>);
        }
        /// The kernels over 16 plain lanes.
        #[cfg(test)]
        mod lanes16 {
            super::kernels::entry_points!($crate::simd::lanes::Lanes::<16>);
        }
    };
}
pub(crate) use instantiate;

/// An internal-error result naming the function whose arguments were wrong.
fn bad(what: &'static str) -> Result<(), KdaError> {
    Err(KdaError::Internal { what })
}

/// Whether `rows` rows of `cols` elements, `ld` apart, fit in `len` elements.
fn fits(len: usize, rows: usize, ld: usize, cols: usize) -> bool {
    ld >= cols
        && (rows - 1)
            .checked_mul(ld)
            .and_then(|v| v.checked_add(cols))
            .is_some_and(|need| need <= len)
}
