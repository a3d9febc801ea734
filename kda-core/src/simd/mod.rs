//! The inner loops every kernel is built from: one set of kernels (`kernels.rs`) written
//! over a small vector abstraction (`vector.rs`), instantiated per instruction set and chosen
//! at run time (RustFFT style).
//!
//! * [`Isa::Portable`]: the reference loops of `portable.rs` (plain Rust the compiler
//!   vectorises for the baseline target; runs everywhere, Cortex-M included). They define the
//!   results every other path is tested against.
//! * [`Isa::Avx2Fma`] (`avx2.rs`), [`Isa::Avx512F`] and [`Isa::Avx512Bf16`] (`avx512.rs`),
//!   [`Isa::Neon`] (`neon.rs`): the generic kernels instantiated for that ISA, inside
//!   `#[target_feature]` entry points.
//!   x86 detection is at run time with the `std` feature, else at compile time
//!   (`-C target-feature=…`); NEON is part of every aarch64 target.
//! * In tests, the same generic kernels instantiated over plain `[f32; N]` lanes (`lanes.rs`)
//!   at N = 4, 8 and 16, checked bitwise against the reference loops: every width-dependent
//!   part (tiles, blocks, tails) is exercised at every ISA's width on any machine.
//!
//! Adding an ISA: one file with its `Simd` impl and an `instantiate!` line, plus its arm in
//! [`Isa`] and `dispatch!`.
//!
//! Every function here gives the same answer, bitwise, for any split of the work across calls
//! or threads; the paths differ from each other only by rounding (FMA vs separate multiply and
//! add; the vector `exp` is within 2 ulp of `libm`). Each fast path is tested against the
//! portable one in this module's tests.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
// Without a vector ISA (Cortex-M, other targets) only the reference loops run: the generic
// kernels, the trait and the arguments only the ISA arms of `dispatch!` read are unused there.
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
mod kernels;
#[cfg(test)]
mod lanes;
#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
mod vector;

use half::bf16;

use crate::error::KdaError;
use kernels::Gemm;

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

/// Whether this CPU runs each 512-bit FMA as two 256-bit halves: AMD family 19h (Zen 4; Zen 3,
/// the same family, has no AVX-512). Read once with CPUID and kept; on other x86-64 CPUs (Zen 5,
/// Intel) false.
#[cfg(target_arch = "x86_64")]
fn split_512_bit_fma() -> bool {
    use core::sync::atomic::{AtomicU8, Ordering};
    // 0: not read yet, 1: no, 2: yes.
    static SPLIT: AtomicU8 = AtomicU8::new(0);
    match SPLIT.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let split = amd_family() == Some(0x19);
            SPLIT.store(if split { 2 } else { 1 }, Ordering::Relaxed);
            split
        }
    }
}

/// The CPU family (CPUID leaf 1, with the extended family) on an AMD CPU; `None` elsewhere.
#[cfg(target_arch = "x86_64")]
fn amd_family() -> Option<u32> {
    // SAFETY: CPUID leaves 0 and 1 exist on every x86-64 CPU (`__cpuid` is a safe function
    // in newer Rust, hence the `allow`).
    #[allow(unused_unsafe)]
    let (vendor, signature) = unsafe {
        let v = core::arch::x86_64::__cpuid(0);
        ([v.ebx, v.edx, v.ecx], core::arch::x86_64::__cpuid(1).eax)
    };
    // "AuthenticAMD" as CPUID returns it.
    if vendor != [0x6874_7541, 0x6974_6e65, 0x444d_4163] {
        return None;
    }
    let base = (signature >> 8) & 0xf;
    Some(if base == 0xf {
        base + ((signature >> 20) & 0xff)
    } else {
        base
    })
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

/// Every vector path to test on this machine: the plain-lanes instantiations at 4, 8 and 16
/// lanes, then each ISA this CPU has (a "skipped: no …" line for each it lacks).
#[cfg(test)]
pub(crate) fn test_paths() -> std::vec::Vec<Path> {
    let mut v = std::vec![Path::Lanes(4), Path::Lanes(8), Path::Lanes(16)];
    for (isa, ok) in Isa::all().filter(|(i, _)| *i != Isa::Portable) {
        if ok {
            v.push(isa.into());
        } else {
            std::println!("skipped: no {} ({isa:?} path untested here)", isa.feature());
        }
    }
    std::println!("paths tested: {v:?}");
    v
}

#[cfg(test)]
mod lanes4 {
    super::kernels::instantiate!(super::lanes::Lanes::<4>);
}
#[cfg(test)]
mod lanes8 {
    super::kernels::instantiate!(super::lanes::Lanes::<8>);
}
#[cfg(test)]
mod lanes16 {
    super::kernels::instantiate!(super::lanes::Lanes::<16>);
}

/// Runs kernel `$name` on `$path`: the ISA's instantiation when asked for and the CPU has it
/// (else the reference `$reference`), or a plain-lanes instantiation in tests.
macro_rules! dispatch {
    ($path:expr, $name:ident ( $($arg:expr),* ), $reference:expr) => {{
        let path: Path = $path.into();
        match path {
            // SAFETY: the CPU has the ISA (checked in the guard), the only requirement of the
            // entry points beyond the slice lengths the safe wrappers here have checked.
            #[cfg(target_arch = "x86_64")]
            Path::Avx512Bf16 if avx512_bf16_supported() => unsafe {
                avx512::with_bf16::$name($($arg),*)
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 if avx512_supported() => unsafe { avx512::$name($($arg),*) },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 if avx2_fma_supported() => unsafe { avx2::$name($($arg),*) },
            // SAFETY: NEON is part of every aarch64 target; lengths checked by the wrappers.
            #[cfg(target_arch = "aarch64")]
            Path::Neon => unsafe { neon::$name($($arg),*) },
            // SAFETY: plain Rust; lengths checked by the wrappers.
            #[cfg(test)]
            Path::Lanes(4) => unsafe { lanes4::$name($($arg),*) },
            // SAFETY: as above.
            #[cfg(test)]
            Path::Lanes(8) => unsafe { lanes8::$name($($arg),*) },
            // SAFETY: as above.
            #[cfg(test)]
            Path::Lanes(16) => unsafe { lanes16::$name($($arg),*) },
            _ => $reference,
        }
    }};
}

/// Outputs per packed panel ([`pack_panel`], [`panel_fma`]): the panel's width and the
/// accumulator row stride.
pub const PANEL: usize = crate::weights::PANEL_ROWS;

/// Most weight rows per [`rows_fma`] call, and its accumulator row stride.
pub const DIRECT: usize = 32;

/// Most 16-row panels per call of the decode kernels (`panels_fma`, `pairs_panels_fma`): the
/// rows of a decode tile are `DECODE_PANELS · 16`.
pub const DECODE_PANELS: usize = 8;

/// The decode kernels' accumulator row stride per token, `acc[t·DECODE_LD + 16p + r]`; also
/// the rows of one decode tile.
pub const DECODE_LD: usize = DECODE_PANELS * PANEL;

/// Weight rows of a projection tile, f32 or bf16: up to [`PANEL`] for [`pack_panel`], up to
/// [`DIRECT`] for [`rows_fma`].
#[derive(Clone, Copy)]
pub enum Rows<'a, 'b> {
    /// f32 rows.
    F32(&'a [&'b [f32]]),
    /// bf16 rows.
    Bf16(&'a [&'b [bf16]]),
}

impl Rows<'_, '_> {
    fn ok(&self, k1: usize, most: usize) -> bool {
        fn all<W>(ws: &[&[W]], k1: usize, most: usize) -> bool {
            (1..=most).contains(&ws.len()) && ws.iter().all(|w| w.len() >= k1)
        }
        match self {
            Rows::F32(ws) => all(ws, k1, most),
            Rows::Bf16(ws) => all(ws, k1, most),
        }
    }
}

/// An internal-error result naming the function whose arguments were wrong.
fn bad(what: &'static str) -> Result<(), KdaError> {
    Err(KdaError::Internal { what })
}

/// Projection kernels. Each output of a tile is one chain over the reduction in order,
/// `acc ← acc + x[k]·W[r][k]` (a fused multiply-add on the FMA paths, multiply then add on
/// the portable one), continued across calls through `acc[t·16 + r]` (`r` < the tile's row
/// count). [`pack_panel`] + [`panel_fma`] (prefill: the panel is reused by every token) and
/// [`rows_fma`] (decode: straight from the rows) give bitwise the same sums on one path, and
/// so do any k-blocking and any grouping of tokens or rows: decode and prefill, on any number
/// of threads, agree exactly.
///
/// Packs `W[r][k]` for `k0 ≤ k < k1` as `panel[(k − k0)·16 + r]`, widened to f32 (rows past the
/// tile's last repeat it). A slice too short for the shape (a bug) is an
/// [`KdaError::Internal`] error, with nothing done.
pub fn pack_panel(
    isa: impl Into<Path>,
    ws: Rows<'_, '_>,
    k0: usize,
    k1: usize,
    panel: &mut [f32],
) -> Result<(), KdaError> {
    if k0 > k1 || !ws.ok(k1, PANEL) || panel.len() < (k1 - k0) * PANEL {
        return bad("simd::pack_panel arguments");
    }
    match ws {
        Rows::F32(w) => dispatch!(
            isa,
            pack_panel(w, k0, k1, panel),
            portable::pack_panel(w, k0, k1, panel, |v| v)
        ),
        Rows::Bf16(w) => dispatch!(
            isa,
            pack_panel(w, k0, k1, panel),
            portable::pack_panel(w, k0, k1, panel, portable::bf16_to_f32)
        ),
    }
    Ok(())
}

/// Continues `acc[t·16 + r]` over `k0..k1` for every token row `xs[t]` (each ≥ `k1` long)
/// from a panel packed by [`pack_panel`] for the same `k0..k1`. A slice too short (a bug) is
/// an [`KdaError::Internal`] error.
pub fn panel_fma(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    k0: usize,
    k1: usize,
    panel: &[f32],
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if !(steps_ok(xs, (k0, k1), panel.len()) && group_acc_ok(xs.len(), 1, (acc.len(), PANEL))) {
        return bad("simd::panel_fma arguments");
    }
    dispatch!(
        isa,
        panel_fma(xs, (k0, k1), &[panel], (acc, PANEL), &[]),
        portable::panel_fma(xs, k0, k1, panel, acc)
    );
    Ok(())
}

/// Whether token rows `xs` reach step `k1` and a panel of `panel_len` elements holds steps
/// `k0..k1` (`k0 ≤ k1`).
fn steps_ok(xs: &[&[f32]], (k0, k1): (usize, usize), panel_len: usize) -> bool {
    k0 <= k1 && panel_len >= (k1 - k0) * PANEL && xs.iter().all(|x| x.len() >= k1)
}

/// Continues `acc[t·32 + r]` over `k0..k1` straight from up to [`DIRECT`] weight rows (the
/// same sums as [`pack_panel`] + [`panel_fma`]). A slice too short (a bug) is an [`KdaError::Internal`] error.
pub fn rows_fma(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    ws: Rows<'_, '_>,
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if k0 > k1
        || !ws.ok(k1, DIRECT)
        || acc.len() < xs.len() * DIRECT
        || xs.iter().any(|x| x.len() < k1)
    {
        return bad("simd::rows_fma arguments");
    }
    match ws {
        Rows::F32(w) => dispatch!(
            isa,
            rows_fma(xs, w, k0, k1, acc),
            portable::rows_fma(xs, w, k0, k1, acc, |v| v)
        ),
        Rows::Bf16(w) => dispatch!(
            isa,
            rows_fma(xs, w, k0, k1, acc),
            portable::rows_fma(xs, w, k0, k1, acc, portable::bf16_to_f32)
        ),
    }
    Ok(())
}

/// Continues `acc[t·DECODE_LD + 16p + r]` (`t` < 4 tokens, `p` < [`DECODE_PANELS`]) over `k0..k1` straight
/// from bf16 weights in the panel layout ([`crate::MatRef::new_panels`]; `panels[p]` is one
/// 16-row panel, ≥ `16·k1` long): the same in-order sums as [`pack_panel`] + [`panel_fma`] of
/// the same rows, bitwise, on each path. A slice too short (a bug) is an [`KdaError::Internal`] error.
pub fn panels_fma(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    panels: &[&[bf16]],
    k0: usize,
    k1: usize,
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if k0 > k1
        || !(1..=4).contains(&xs.len())
        || !(1..=DECODE_PANELS).contains(&panels.len())
        || panels.iter().any(|p| p.len() < k1 * PANEL)
        || xs.iter().any(|x| x.len() < k1)
        || acc.len() < xs.len() * DECODE_LD
    {
        return bad("simd::panels_fma arguments");
    }
    dispatch!(
        isa,
        panels_fma(xs, panels, k0, k1, acc),
        portable::panels_fma(xs, panels, k0, k1, acc)
    );
    Ok(())
}

/// [`panel_fma`] straight from bf16 panels of the panel layout, widened as they are loaded:
/// continues `acc[t·ld + 16p + r]` over `k0..k1` for each panel `p` of `panels` (each
/// starting at step `k0`, element `(k, r)` at `16·(k − k0) + r`): the same sums, bitwise,
/// without a widened copy. A slice too short or `ld` under `16·panels.len()` (a bug) is an
/// [`KdaError::Internal`] error. `ahead`, if it holds a slice of at least `k1 − k0` steps per
/// panel (else it is ignored), is prefetched into L2 while the first register block of tokens
/// runs, a line every step or two (the prefill's next group of panels; results do not depend
/// on it).
pub fn panel_fma_bf16(
    isa: impl Into<Path>,
    xs: &[&[f32]],
    (k0, k1): (usize, usize),
    panels: &[&[bf16]],
    (acc, ld): (&mut [f32], usize),
    ahead: &[&[bf16]],
) -> Result<(), KdaError> {
    let shortest = panels.iter().map(|p| p.len()).min().unwrap_or(usize::MAX);
    if !(steps_ok(xs, (k0, k1), shortest) && group_acc_ok(xs.len(), panels.len(), (acc.len(), ld)))
    {
        return bad("simd::panel_fma_bf16 arguments");
    }
    let _ = ahead; // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(
        isa,
        panel_fma(xs, (k0, k1), panels, (acc, ld), ahead),
        for (p, panel) in panels.iter().enumerate() {
            let a = &mut acc[p * PANEL..];
            portable::panel_fma_bf16(xs, k0, k1, panel, a, ld)
        }
    );
    Ok(())
}

/// Whether accumulators of `acc_len` elements hold `acc[t·ld + 16p + r]` for `tokens` tokens
/// and `panels` panels, tokens `ld ≥ 16·panels` apart (the prefill GEMMs' layout).
fn group_acc_ok(tokens: usize, panels: usize, (acc_len, ld): (usize, usize)) -> bool {
    let width = panels * PANEL;
    let need = match tokens {
        0 => 0,
        m => (m - 1).saturating_mul(ld).saturating_add(width),
    };
    ld >= width && acc_len >= need
}

/// Steps of a bf16 panel the pair kernels cover: pairs `j0..j1` of a panel of `n` steps
/// (pair `j` joins steps `2j` and `2j + 1`; when `n` is odd the last pair's odd step is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairSteps {
    /// First pair.
    pub j0: usize,
    /// One past the last pair (at most `n.div_ceil(2)`).
    pub j1: usize,
    /// Steps (the reduction length) of the panel.
    pub n: usize,
}

impl PairSteps {
    /// Every pair of a panel of `n` steps.
    pub fn all(n: usize) -> Self {
        PairSteps {
            j0: 0,
            j1: n.div_ceil(2),
            n,
        }
    }

    fn ok(&self, panel_len: usize, xs: &[&[u32]]) -> bool {
        self.j0 <= self.j1
            && self.j1 <= self.n.div_ceil(2)
            && panel_len >= self.n * PANEL
            && xs.iter().all(|x| x.len() >= self.j1)
    }

    fn tuple(self) -> (usize, usize, usize) {
        (self.j0, self.j1, self.n)
    }
}

/// The bf16 precision mode's prefill GEMM: for each panel `p` of `panels` (bf16, the panel
/// layout, from step 0), continues `acc[t·ld + 16p + r]` over pairs `steps.j0..steps.j1`
/// for token rows of bf16 pairs (from [`round_pairs_row`]): per output the chain
/// `acc ← acc + x_odd·w_odd + x_even·w_even` over the pairs in order, each addition rounded
/// (`vdpbf16ps` on [`Isa::Avx512Bf16`], two multiply-adds elsewhere: bitwise the same except
/// that `vdpbf16ps` flushes subnormals). A slice too short or `ld` under `16·panels.len()`
/// (a bug) is an [`KdaError::Internal`] error. `ahead` (one slice per panel from pair `j0`,
/// or empty) is prefetched as [`panel_fma_bf16`]'s is; the results do not depend on it.
pub fn pairs_panel_fma(
    isa: impl Into<Path>,
    xs: &[&[u32]],
    steps: PairSteps,
    panels: &[&[bf16]],
    (acc, ld): (&mut [f32], usize),
    ahead: &[&[bf16]],
) -> Result<(), KdaError> {
    if panels.iter().any(|p| !steps.ok(p.len(), xs))
        || !group_acc_ok(xs.len(), panels.len(), (acc.len(), ld))
    {
        return bad("simd::pairs_panel_fma arguments");
    }
    let st = steps.tuple();
    let _ = ahead; // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(
        isa,
        pairs_panel_fma(xs, st, panels, (acc, ld), ahead),
        portable::pairs_panels_fma(xs, panels, st, acc, ld)
    );
    Ok(())
}

/// The bf16 mode's decode: continues `acc[t·DECODE_LD + 16p + r]` (`t` < 4 tokens, `p` <
/// [`DECODE_PANELS`])
/// with the same chains as [`pairs_panel_fma`], bitwise, on each path. A slice too short (a
/// bug) is an [`KdaError::Internal`] error.
pub fn pairs_panels_fma(
    isa: impl Into<Path>,
    xs: &[&[u32]],
    panels: &[&[bf16]],
    steps: PairSteps,
    acc: &mut [f32],
) -> Result<(), KdaError> {
    if !(1..=4).contains(&xs.len())
        || !(1..=DECODE_PANELS).contains(&panels.len())
        || panels.iter().any(|p| !steps.ok(p.len(), xs))
        || acc.len() < xs.len() * DECODE_LD
    {
        return bad("simd::pairs_panels_fma arguments");
    }
    let st = steps.tuple();
    dispatch!(
        isa,
        pairs_panels_fma(xs, panels, st, acc),
        portable::pairs_panels_fma(xs, panels, st, acc, DECODE_LD)
    );
    Ok(())
}

/// Rounds a row of activations to bf16 pairs for the bf16 mode: `out[j]` packs `x[2j]` (low
/// 16 bits) and `x[2j + 1]` (0 past the end), each rounded to nearest even with subnormals
/// to zero, as `vcvtne2ps2bf16` does (and does natively on [`Isa::Avx512Bf16`]; bitwise the
/// same on every path). `out` must be `x.len().div_ceil(2)` long, else an
/// [`KdaError::Internal`] error.
pub fn round_pairs_row(isa: impl Into<Path>, x: &[f32], out: &mut [u32]) -> Result<(), KdaError> {
    if out.len() != x.len().div_ceil(2) {
        return bad("simd::round_pairs_row arguments");
    }
    dispatch!(
        isa,
        round_pairs_row(x, out),
        portable::round_pairs_row(x, out)
    );
    Ok(())
}

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
/// prefetches of a burst (PERFORMANCE.md, twenty-first session). Prefetching never faults, so a row
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

/// `y[i] += a·x[i]`.
#[inline]
pub fn axpy(isa: impl Into<Path>, a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let (x, y) = (&x[..n], &mut y[..n]);
    dispatch!(isa, axpy(a, x, y), portable::axpy(a, x, y))
}

/// Recurrence pass 1 for one key row: `s[i] *= decay; p[i] += k·s[i]`.
#[inline]
pub fn decay_predict(isa: impl Into<Path>, s: &mut [f32], decay: f32, k: f32, p: &mut [f32]) {
    let n = s.len().min(p.len());
    let (s, p) = (&mut s[..n], &mut p[..n]);
    dispatch!(
        isa,
        decay_predict(s, decay, k, p),
        portable::decay_predict(s, decay, k, p)
    )
}

/// Recurrence pass 1 over a whole state `s` `[K, V]` (`V = p.len()`): for each key row `d`,
/// `s[d] *= decay[d]; p += k[d]·s[d]` (one dispatch for all rows).
#[inline]
pub fn decay_predict_rows(
    isa: impl Into<Path>,
    s: &mut [f32],
    k: &[f32],
    decay: &[f32],
    p: &mut [f32],
) {
    decay_predict_rows_io(isa, (None, s), k, decay, p)
}

/// [`decay_predict_rows`] reading the state from `src` and writing the decayed rows to `dst`
/// (`src` is left as it was): `dst[d] = src[d]·decay[d]; p += k[d]·dst[d]`, bitwise the
/// in-place pass on a copy of `src`, without the copy's own pass over memory. Rows: as many as
/// `src`, `dst`, `k` and `decay` all hold.
#[inline]
pub fn decay_predict_rows_from(
    isa: impl Into<Path>,
    src: &[f32],
    dst: &mut [f32],
    k: &[f32],
    decay: &[f32],
    p: &mut [f32],
) {
    decay_predict_rows_io(isa, (Some(src), dst), k, decay, p)
}

/// Pass 1 from `src` (or in place) into `s`, over the rows every slice holds.
#[inline]
fn decay_predict_rows_io(
    isa: impl Into<Path>,
    (src, s): (Option<&[f32]>, &mut [f32]),
    k: &[f32],
    decay: &[f32],
    p: &mut [f32],
) {
    let v = p.len();
    if v == 0 {
        return;
    }
    let rows = (s.len() / v).min(k.len()).min(decay.len());
    let rows = src.map_or(rows, |x| rows.min(x.len() / v));
    let (s, k, decay) = (&mut s[..rows * v], &k[..rows], &decay[..rows]);
    let src = src.map(|x| &x[..rows * v]);
    dispatch!(
        isa,
        decay_predict_rows((src, s), k, decay, p),
        portable::decay_predict_rows((src, s), k, decay, p)
    )
}

/// Recurrence pass 2 over a whole state `s` `[K, V]` (`V = o.len()`): for each key row `d`,
/// `s[d] += k[d]·delta; o += (q[d]·scale)·s[d]` (one dispatch for all rows).
#[inline]
pub fn write_read_rows(
    isa: impl Into<Path>,
    s: &mut [f32],
    k: &[f32],
    delta: &[f32],
    (q, scale): (&[f32], f32),
    o: &mut [f32],
) {
    let v = o.len().min(delta.len());
    if v == 0 {
        return;
    }
    let (delta, o) = (&delta[..v], &mut o[..v]);
    let rows = (s.len() / v).min(k.len()).min(q.len());
    let (s, k, q) = (&mut s[..rows * v], &k[..rows], &q[..rows]);
    dispatch!(
        isa,
        write_read_rows(s, k, delta, (q, scale), o),
        portable::write_read_rows(s, k, delta, (q, scale), o)
    )
}

/// `x[i] = e^{x[i]}` (vector paths: Cephes polynomial, < 2 ulp; flushes below e^−87.5 to 0;
/// the portable path: `libm`).
#[inline]
pub fn exp_in_place(isa: impl Into<Path>, x: &mut [f32]) {
    dispatch!(isa, exp_in_place(x), portable::exp_in_place(x))
}

/// `x[i] = c · sigmoid(x[i])` (vector paths: with their `exp`; the portable path: `libm`, as
/// `crate::math::sigmoid`).
#[inline]
pub fn sigmoid_scaled(isa: impl Into<Path>, x: &mut [f32], c: f32) {
    dispatch!(isa, sigmoid_scaled(x, c), portable::sigmoid_scaled(x, c))
}

/// `x[i] = c · softplus(x[i])`, `softplus(x) = ln(1 + e^x)` (`x` itself above 20). Vector
/// paths: `max(x, 0) + ln(1 + e^{−|x|})` with their `exp` and a series for the logarithm (a
/// few ulp from `libm`); the portable path: `libm`, as `crate::math::softplus`.
#[inline]
pub fn softplus_scaled(isa: impl Into<Path>, x: &mut [f32], c: f32) {
    dispatch!(isa, softplus_scaled(x, c), portable::softplus_scaled(x, c))
}

/// The loads a read probe (`internals::read_sum`) streams its buffer with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadLoads {
    /// The path's widest f32 vector loads (64 bytes on AVX-512).
    Widest,
    /// The path's bf16 loads, `LANES` bf16 values widened to f32 (32 bytes on AVX-512, 16 on
    /// AVX2), as the decode kernels stream their weights. Some CPUs (Zen 5) stream memory
    /// faster with these than with the widest loads, so a read limit needs both.
    Bf16,
}

/// The sum of `data` read as `streams` interleaved far-apart regions (256-byte pieces), with
/// `loads` and, when `prefetch`, software prefetch: the read-bandwidth probe of the
/// benchmarks (its summation order is the path's; not for numerics). With
/// [`ReadLoads::Bf16`] every f32 is read as its two bf16 halves.
pub fn read_sum(
    isa: impl Into<Path>,
    data: &[f32],
    streams: usize,
    prefetch: bool,
    loads: ReadLoads,
) -> f32 {
    let _ = prefetch; // read only by the vector arms
    dispatch!(
        isa,
        read_sum(data, streams, prefetch, loads),
        portable::read_sum(data, streams, loads)
    )
}

/// The short causal conv + SiLU of [`crate::ops::conv`] on the path's vectors, when the path
/// has them: returns `false`, having done nothing, on the reference path, for more than
/// 8 taps, or when the lengths do not fit (the caller then runs its reference loops).
pub fn short_conv(
    isa: impl Into<Path>,
    x: &mut [f32],
    d: usize,
    weight: crate::weights::Data<'_>,
    state: &mut [f32],
) -> bool {
    let w = weight.len() / d.max(1);
    let fits = d > 0
        && (1..=kernels::MAX_TAPS).contains(&w)
        && weight.len() == d * w
        && x.len().is_multiple_of(d)
        && state.len() == d * (w - 1);
    if !fits {
        return false;
    }
    dispatch!(isa, short_conv(x, d, weight, state), false)
}

/// The single-core f32 FMA peak probe on the path: independent multiply-add chains in
/// registers, `iters` rounds. Returns (FMAs done, a value to keep the work alive).
pub fn fma_peak(isa: impl Into<Path>, iters: usize) -> (usize, f32) {
    dispatch!(isa, fma_peak(iters), portable::fma_peak(iters))
}

/// The single-core peak of the bf16 mode's dot products on the path (`Simd::dot_pairs`:
/// `vdpbf16ps` on avx512_bf16, two f32 multiply-adds per pair elsewhere), `iters` rounds of
/// independent chains. Returns (multiply-adds done, a value to keep the work alive). The
/// reference path has no bf16 dot product: it runs [`fma_peak`] (its bf16 mode is f32
/// multiply-adds).
pub fn dot_pairs_peak(isa: impl Into<Path>, iters: usize) -> (usize, f32) {
    dispatch!(isa, dot_pairs_peak(iters), portable::fma_peak(iters))
}

/// Whether `rows` rows of `cols` elements, `ld` apart, fit in `len` elements.
fn fits(len: usize, rows: usize, ld: usize, cols: usize) -> bool {
    ld >= cols
        && (rows - 1)
            .checked_mul(ld)
            .and_then(|v| v.checked_add(cols))
            .is_some_and(|need| need <= len)
}

/// What `C` holds before a GEMM adds `A·B` to it (see [`gemm`]).
#[derive(Clone, Copy, Debug)]
pub enum CStart<'a> {
    /// `C` as it is: `C += A·B`.
    Keep,
    /// Zero: `C = A·B` (`C` is only written).
    Zero,
    /// Each row `i` of `C` times `rows[i]` first: `C = diag(rows)·C + A·B`, bitwise the same
    /// as scaling the rows in a pass of their own and then accumulating.
    ScaledRows(&'a [f32]),
}

/// `C[m×n] += A[m×k] · B[k×n]`, all row-major with leading dimensions `lda`, `ldb`, `ldc`.
///
/// If a slice is too short for the shape (an internal bug), nothing is computed and an
/// [`KdaError::Internal`] error is returned.
// BLAS-style: the shape (m, n, k) and three matrices with their leading dimensions.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn gemm_acc(
    isa: impl Into<Path>,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) -> Result<(), KdaError> {
    gemm(isa, CStart::Keep, (m, n, k), (a, lda), (b, ldb), (c, ldc))
}

/// `C[m×n] = start(C) + A[m×k] · B[k×n]` (see [`CStart`]), all row-major; each operand is
/// given with its leading dimension. Every element is one chain over the reduction in order,
/// whatever the blocking, from its start value (on Zen 4's AVX-512 paths from zero, the start
/// value added last, so that no chain waits for `C`). A slice too short for the shape (an
/// internal bug) is an [`KdaError::Internal`] error, with nothing computed.
#[inline]
pub fn gemm(
    isa: impl Into<Path>,
    start: CStart<'_>,
    (m, n, k): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
) -> Result<(), KdaError> {
    gemm_queued(isa, start, (m, n, k), (a, lda), (b, ldb), (c, ldc), None)
}

/// [`gemm`], prefetching the rows of `queue` meanwhile, a few at a time (the vector paths;
/// the portable one leaves them queued).
#[inline]
pub(crate) fn gemm_queued(
    isa: impl Into<Path>,
    start: CStart<'_>,
    (m, n, k): (usize, usize, usize),
    (a, lda): (&[f32], usize),
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    queue: Option<&RowQueue<'_>>,
) -> Result<(), KdaError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if !(fits(c.len(), m, ldc, n)
        && (k == 0 || fits(a.len(), m, lda, k) && fits(b.len(), k, ldb, n)))
    {
        return bad("simd::gemm arguments");
    }
    let c_start = match start {
        CStart::Keep => kernels::CInit::Load,
        CStart::Zero => kernels::CInit::Zero,
        CStart::ScaledRows(f) if f.len() >= m => kernels::CInit::LoadScaled(f.as_ptr()),
        CStart::ScaledRows(_) => return bad("simd::gemm row scales"),
    };
    if k == 0 {
        portable::start_c(start, m, n, c, ldc);
        return Ok(());
    }
    let g = Gemm {
        a: a.as_ptr(),
        lda,
        b: b.as_ptr(),
        ldb,
        c: c.as_mut_ptr(),
        ldc,
        k,
        c_start,
        queue,
    };
    let _ = &g; // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(isa, gemm_acc(m, n, &g), {
        portable::start_c(start, m, n, c, ldc);
        portable::gemm_acc(m, n, k, a, lda, b, ldb, c, ldc)
    });
    Ok(())
}

/// The inputs of [`tame_rows`]: `rows` rows of `dim` of `q`, `k` and the log-decays `g`,
/// each with its row stride.
#[derive(Clone, Copy, Debug)]
pub struct TameIn<'a> {
    /// Queries.
    pub q: (&'a [f32], usize),
    /// Keys.
    pub k: (&'a [f32], usize),
    /// Log-decays.
    pub g: (&'a [f32], usize),
    /// Rows (tokens), at least 1.
    pub rows: usize,
    /// Elements per row, at least 1.
    pub dim: usize,
    /// The query scale.
    pub scale: f32,
    /// The largest `|b_r − b_0|` of a tame chunk.
    pub limit: f32,
}

/// The outputs of [`tame_rows`]: `[rows, dim]` row-major but `first` and `last` (`[dim]`).
#[derive(Debug)]
pub struct TameOut<'a> {
    /// `q ⊙ e^{b_r − b_0}`.
    pub qf: &'a mut [f32],
    /// `k ⊙ e^{b_r − b_0}`.
    pub kf: &'a mut [f32],
    /// `k ⊙ (1 / e^{b_r − b_0})`.
    pub kb: &'a mut [f32],
    /// `(scale · e^{b_0}) ⊙ qf`.
    pub qd: &'a mut [f32],
    /// `e^{b_0} ⊙ kf`.
    pub kd: &'a mut [f32],
    /// `e^{b_0}` (`b_0 = g_0`).
    pub first: &'a mut [f32],
    /// The last row's `e^{b_r − b_0}`.
    pub last: &'a mut [f32],
    /// `[dim]` the last row's `b_r`, high part.
    pub hi: &'a mut [f32],
    /// `[dim]` the last row's `b_r`, low part (TwoSum-compensated).
    pub lo: &'a mut [f32],
}

/// A tame chunk's row factors in one pass: `b_r` is the TwoSum-compensated running sum of `g`
/// over the rows (`b_0 = g_0`), and each output is as its field says, every product rounded
/// once in the order written there. Returns `Ok(false)` if some `|b_r − b_0|` exceeds `limit`
/// or is NaN (the outputs are then partly written). The vector paths give the reference's bits
/// but for their `exp`. A slice too short for the shape (a bug) is an
/// [`KdaError::Internal`] error, with nothing computed.
pub fn tame_rows(
    isa: impl Into<Path>,
    i: &TameIn<'_>,
    o: &mut TameOut<'_>,
) -> Result<bool, KdaError> {
    let (l, kd) = (i.rows, i.dim);
    let area = l.checked_mul(kd);
    let rows_fit = |(x, ld): (&[f32], usize)| fits(x.len(), l, ld, kd);
    let ok = l > 0
        && kd > 0
        && rows_fit(i.q)
        && rows_fit(i.k)
        && rows_fit(i.g)
        && [&o.qf, &o.kf, &o.kb, &o.qd, &o.kd]
            .iter()
            .all(|x| area.is_some_and(|a| x.len() >= a))
        && [&o.first, &o.last, &o.hi, &o.lo]
            .iter()
            .all(|x| x.len() >= kd);
    if !ok {
        return Err(KdaError::Internal {
            what: "simd::tame_rows arguments",
        });
    }
    let src = |(x, stride): (&[f32], usize)| kernels::Src {
        p: x.as_ptr(),
        stride,
    };
    let t = kernels::Tame {
        q: src(i.q),
        k: src(i.k),
        g: src(i.g),
        rows: l,
        dim: kd,
        scale: i.scale,
        limit: i.limit,
        qf: o.qf.as_mut_ptr(),
        kf: o.kf.as_mut_ptr(),
        kb: o.kb.as_mut_ptr(),
        qd: o.qd.as_mut_ptr(),
        kd: o.kd.as_mut_ptr(),
        first: o.first.as_mut_ptr(),
        last: o.last.as_mut_ptr(),
        hi: o.hi.as_mut_ptr(),
        lo: o.lo.as_mut_ptr(),
    };
    let _ = &t; // read only by the vector arms (none on targets without a vector ISA)
    Ok(dispatch!(isa, tame_rows(&t), portable::tame_rows(i, o)))
}

/// Whether [`gemm`] runs a reduction of `k` steps over `n` columns on `isa` as one pass of
/// small row blocks (see `Simd::split_fma_gemms`): a caller that splits such a product into
/// row groups for the other shapes' sake can then make one call.
pub(crate) fn short_gemm(isa: impl Into<Path>, k: usize, n: usize) -> bool {
    let _ = (k, n); // read only by the vector arms (none on targets without a vector ISA)
    dispatch!(isa, short_gemm(k, n), false)
}

/// `dst[c·ldd + r] = src[r·lds + c]` for an `rows × cols` block (out-of-place transpose).
/// A slice too short for the shape (a bug) is an [`KdaError::Internal`] error, with nothing
/// done.
pub fn transpose(
    isa: impl Into<Path>,
    rows: usize,
    cols: usize,
    src: &[f32],
    lds: usize,
    dst: &mut [f32],
    ldd: usize,
) -> Result<(), KdaError> {
    transpose_with(isa.into(), (rows, cols), (src, lds), (dst, ldd), None)
}

/// [`transpose`], and in the same pass `scaled[c·ldd + r] = scales[c] · src[r·lds + c]`: the
/// transpose with each of its rows scaled, as a second output (bitwise the products that a
/// pass of its own over the transpose would make).
pub(crate) fn transpose_scaled(
    isa: impl Into<Path>,
    shape: (usize, usize),
    src: (&[f32], usize),
    dst: (&mut [f32], usize),
    scaled: (&mut [f32], &[f32]),
) -> Result<(), KdaError> {
    transpose_with(isa.into(), shape, src, dst, Some(scaled))
}

/// [`transpose`] and [`transpose_scaled`]: every slice checked against the shape first.
fn transpose_with(
    isa: Path,
    (rows, cols): (usize, usize),
    (src, lds): (&[f32], usize),
    (dst, ldd): (&mut [f32], usize),
    scaled: Option<(&mut [f32], &[f32])>,
) -> Result<(), KdaError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let second_fits = scaled
        .as_ref()
        .is_none_or(|(d, f)| fits(d.len(), cols, ldd, rows) && f.len() >= cols);
    if !(fits(src.len(), rows, lds, cols) && fits(dst.len(), cols, ldd, rows) && second_fits) {
        return bad("simd::transpose arguments");
    }
    dispatch!(
        isa,
        transpose((rows, cols), (src, lds), (dst, ldd), scaled),
        portable::transpose((rows, cols), (src, lds), (dst, ldd), scaled)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    fn rnd(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed as u64;
        (0..n).map(|_| crate::test_rng::uniform(&mut s)).collect()
    }

    fn close(a: f32, b: f32, tol: f32) -> bool {
        (a - b).abs() <= tol * (1.0 + b.abs())
    }

    /// Whether `a` and `b` hold the same bits.
    fn bits_eq(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Whether `path` promises the reference loops' bits (no fused multiply-add).
    fn exact(path: Path) -> bool {
        matches!(path, Path::Lanes(_))
    }

    /// `a` equals `b` bitwise on an exact path, else within `tol` relative.
    fn same(path: Path, a: &[f32], b: &[f32], tol: f32) -> bool {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| {
                if exact(path) {
                    x.to_bits() == y.to_bits()
                } else {
                    close(*x, *y, tol)
                }
            })
    }

    #[test]
    fn every_path_matches_portable() {
        for path in test_paths() {
            for n in [0usize, 1, 3, 4, 5, 7, 8, 15, 16, 17, 31, 33, 100, 128, 257] {
                let x = rnd(n, 1);
                let mut y1 = rnd(n, 7);
                let mut y2 = y1.clone();
                axpy(path, 0.3, &x, &mut y1);
                portable::axpy(0.3, &x, &mut y2);
                assert!(same(path, &y1, &y2, 1e-6), "{path:?} axpy n={n}");
                // A state of 3 key rows of n values.
                let (mut s1, mut p1) = (rnd(3 * n, 8), rnd(n, 9));
                let (mut s2, mut p2) = (s1.clone(), p1.clone());
                let (k, decay, q) = (rnd(3, 10), rnd(3, 11), rnd(3, 12));
                // From a source state into another buffer: bitwise the in-place pass, the
                // source untouched, whatever the buffer held.
                let (src, mut s3, mut p3) = (s1.clone(), rnd(3 * n, 13), p1.clone());
                decay_predict_rows_from(path, &src, &mut s3, &k, &decay, &mut p3);
                let mut s4 = src.clone();
                let mut p4 = p1.clone();
                portable::decay_predict_rows((Some(&src), &mut s4), &k, &decay, &mut p4);
                decay_predict_rows(path, &mut s1, &k, &decay, &mut p1);
                portable::decay_predict_rows((None, &mut s2), &k, &decay, &mut p2);
                assert!(same(path, &s1, &s2, 1e-6) && same(path, &p1, &p2, 1e-6));
                assert!(
                    bits_eq(&s3, &s1) && bits_eq(&p3, &p1),
                    "{path:?} from n={n}"
                );
                assert!(
                    bits_eq(&s4, &s2) && bits_eq(&p4, &p2),
                    "reference from n={n}"
                );
                assert!(
                    bits_eq(&src, &rnd(3 * n, 8)),
                    "{path:?} source changed n={n}"
                );
                write_read_rows(path, &mut s1, &k, &x, (&q, 1.3), &mut p1);
                portable::write_read_rows(&mut s2, &k, &x, (&q, 1.3), &mut p2);
                assert!(same(path, &s1, &s2, 1e-6) && same(path, &p1, &p2, 1e-6));
                decay_predict(path, &mut s1[..n], 0.7, 0.2, &mut p1);
                portable::decay_predict(&mut s2[..n], 0.7, 0.2, &mut p2);
                assert!(same(path, &s1, &s2, 1e-6) && same(path, &p1, &p2, 1e-6));
            }
        }
    }

    /// The vector sigmoid and softplus against `libm` (the portable path) on every path:
    /// within a few ulp, or 1e-37 absolute where the vector `exp` flushes; NaN, ±∞, ±0 and the
    /// softplus threshold included; the portable path itself bit for bit.
    #[test]
    fn sigmoid_and_softplus_match_libm() {
        let mut xs: Vec<f32> = (0..3000).map(|i| -120.0 + i as f32 * 0.0801).collect();
        xs.extend([
            0.0,
            -0.0,
            19.999,
            20.0,
            20.001,
            1e-30,
            -1e-30,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        for path in core::iter::once(Path::Reference).chain(test_paths()) {
            for c in [1.0f32, -0.75] {
                let (mut sig, mut sp) = (xs.clone(), xs.clone());
                sigmoid_scaled(path, &mut sig, c);
                softplus_scaled(path, &mut sp, c);
                for (i, &x) in xs.iter().enumerate() {
                    let want_sig = c * crate::math::sigmoid(x);
                    let want_sp = c * crate::math::softplus(x);
                    for (got, want, what) in
                        [(sig[i], want_sig, "sigmoid"), (sp[i], want_sp, "softplus")]
                    {
                        let ok = if want.is_nan() {
                            got.is_nan()
                        } else if path == Path::Reference {
                            got.to_bits() == want.to_bits()
                        } else {
                            got == want || (got - want).abs() <= 6e-7 * want.abs() + 1e-37
                        };
                        assert!(ok, "{path:?} {what}({x}) · {c}: {got} vs {want}");
                    }
                }
            }
        }
    }

    /// Each ISA's few operations against the plain lanes of the same width, on values that
    /// include NaN, infinities, ties and the exp limits.
    #[test]
    fn isa_operations_match_plain_lanes() {
        let vals: Vec<f32> = [
            0.5,
            -0.5,
            1.5,
            2.5,
            -2.5,
            0.0,
            -0.0,
            88.5,
            -88.5,
            -87.6,
            3.0,
            -127.0,
            127.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]
        .into_iter()
        .chain(rnd(400, 77).into_iter().map(|v| v * 50.0))
        .collect();
        let wide: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
        for (isa, ok) in Isa::all() {
            if !ok || isa == Isa::Portable {
                if !ok {
                    std::println!("skipped: no {}", isa.feature());
                }
                continue;
            }
            check_ops(isa, &vals, &wide);
        }
    }

    /// Runs [`ops_trace`] for `isa` and for plain lanes of its width and compares them.
    fn check_ops(isa: Isa, vals: &[f32], wide: &[bf16]) {
        let (got, want) = match isa {
            // SAFETY: `isa` is supported (checked by the caller).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => unsafe {
                (
                    ops_trace(avx2::Avx2::new_unchecked(), vals, wide),
                    ops_trace(lanes::Lanes::<8>, vals, wide),
                )
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512F => unsafe {
                (
                    ops_trace(avx512::Avx512::<false>::new_unchecked(), vals, wide),
                    ops_trace(lanes::Lanes::<16>, vals, wide),
                )
            },
            // SAFETY: as above.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => unsafe {
                (
                    ops_trace(avx512::Avx512::<true>::new_unchecked(), vals, wide),
                    ops_trace(lanes::Lanes::<16>, vals, wide),
                )
            },
            // SAFETY: as above.
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => unsafe {
                (
                    ops_trace(neon::Neon::new_unchecked(), vals, wide),
                    ops_trace(lanes::Lanes::<4>, vals, wide),
                )
            },
            _ => return,
        };
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let ok = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
            assert!(ok, "{isa:?} operation trace [{i}]: {g} vs plain lanes {w}");
        }
    }

    /// The results of every exactly-specified [`vector::Simd`] operation on `vals` (all but
    /// `mul_add`, fused only on the ISAs, `reduce_sum`, whose order is the ISA's, and `exp`,
    /// tested separately), in one list.
    fn ops_trace<S: vector::Simd>(s: S, vals: &[f32], wide: &[bf16]) -> Vec<f32> {
        let l = S::LANES;
        let mut out = Vec::new();
        let put = |v: S::F, out: &mut Vec<f32>| {
            let mut buf = [0.0f32; vector::MAX_LANES];
            // SAFETY: `buf` holds MAX_LANES ≥ LANES f32.
            unsafe { s.store(buf.as_mut_ptr(), v) };
            out.extend_from_slice(&buf[..l]);
        };
        let exponents: Vec<f32> = (-127..=128).map(|n| n as f32).collect();
        for n in exponents.chunks_exact(l) {
            // SAFETY: LANES values.
            put(s.pow2i(unsafe { s.load(n.as_ptr()) }), &mut out);
        }
        for (i, (c, cw)) in vals.chunks_exact(l).zip(wide.chunks_exact(l)).enumerate() {
            // SAFETY: each chunk holds LANES values; `rows` has LANES pointers, each to at
            // least LANES (+ 1 for bf16) values.
            unsafe {
                let a = s.load(c.as_ptr());
                let b = s.add(a, s.splat(-3.0));
                put(b, &mut out);
                put(s.mul(a, b), &mut out);
                put(s.sub(b, a), &mut out);
                put(s.clamp(a, -88.0, 88.0), &mut out);
                put(s.round(s.clamp(a, -88.0, 88.0)), &mut out);
                put(s.zero_below(a, -87.5, b), &mut out);
                put(s.load_bf16(cw.as_ptr()), &mut out);
                put(s.broadcast(&c[3]), &mut out);
                put(s.load_partial(c.as_ptr(), 3), &mut out);
                let mut part = [9.0f32; vector::MAX_LANES];
                s.store_partial(part.as_mut_ptr(), l - 1, a);
                out.extend_from_slice(&part[..l]);
                let rows: Vec<*const f32> = (0..l).map(|r| vals[i + r * l..].as_ptr()).collect();
                let tile = s.load_tile(&rows, 1);
                for j in 0..l {
                    put(s.tile_col(&tile, j), &mut out);
                }
                let rows: Vec<*const bf16> = (0..l).map(|r| wide[i + r..].as_ptr()).collect();
                let tile = s.load_tile(&rows, 1);
                for j in 0..l {
                    put(s.tile_col(&tile, j), &mut out);
                }
                check_lane_ops(s, a, b, &wide[i * l..]);
                // bf16 pairs: this chunk's bf16 as the even elements, the next ones as the odd.
                let odd = &wide[(i * l + 1).min(wide.len() - l)..];
                let pa = s.load_pairs(cw.as_ptr(), odd.as_ptr());
                let pair = vector::round_pair(c[0], c[1]);
                put(s.dot_pairs(b, pa, s.broadcast_pair(&pair)), &mut out);
                let sum = s.reduce_sum(a);
                let want: f32 = c.iter().sum();
                let ok = (sum - want).abs() <= 1e-5 * c.iter().map(|v| v.abs()).sum::<f32>();
                assert!(ok || !want.is_finite(), "reduce_sum {sum} vs {want}");
            }
        }
        out
    }

    /// `mul_add_lane::<J>` is `mul_add` with lane `J` splatted, `load_bf16_pair` is two
    /// `load_bf16`, `load_bf16_parity` and `deinterleave` give the even and the odd elements,
    /// and `interleave` undoes `deinterleave`, bit for bit (NaN matching NaN); `wide` holds at
    /// least `LANES` bf16 (pairs are read only where it holds `2·LANES`).
    ///
    /// # Safety
    /// `S`'s instruction set is available.
    unsafe fn check_lane_ops<S: vector::Simd>(s: S, a: S::F, b: S::F, wide: &[bf16]) {
        let l = S::LANES;
        let lanes = |v: S::F| {
            let mut buf = [0.0f32; vector::MAX_LANES];
            s.store(buf.as_mut_ptr(), v);
            buf
        };
        let same = |x: S::F, y: S::F, what: &str| {
            for (x, y) in lanes(x).iter().zip(lanes(y).iter()).take(l) {
                assert!(
                    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                    "{what}: {x} vs {y}"
                );
            }
        };
        let (al, c) = (lanes(a), s.splat(0.375));
        // The lane is a const parameter: one call per lane.
        macro_rules! lane {
            ($($j:literal),*) => {$(
                same(
                    s.mul_add_lane::<$j>(a, b, c),
                    s.mul_add(s.splat(al[$j]), b, c),
                    concat!("lane ", $j),
                );
            )*};
        }
        lane!(0, 1, 2, 3);
        if wide.len() >= 2 * l {
            let (lo, hi) = s.load_bf16_pair(wide.as_ptr());
            same(lo, s.load_bf16(wide.as_ptr()), "bf16 pair, first");
            same(hi, s.load_bf16(wide[l..].as_ptr()), "bf16 pair, second");
            let widened: Vec<f32> = wide[..2 * l].iter().map(|&w| w.to_f32()).collect();
            let split = |parity: usize| {
                let v: Vec<f32> = widened.iter().skip(parity).step_by(2).copied().collect();
                s.load(v.as_ptr())
            };
            let (even, odd) = s.load_bf16_parity(wide.as_ptr());
            same(even, split(0), "bf16 parity, even");
            same(odd, split(1), "bf16 parity, odd");
            let (even, odd) =
                s.deinterleave(s.load(widened.as_ptr()), s.load(widened[l..].as_ptr()));
            same(even, split(0), "deinterleave, even");
            same(odd, split(1), "deinterleave, odd");
            let (first, second) = s.interleave(even, odd);
            same(first, s.load(widened.as_ptr()), "interleave, first");
            same(second, s.load(widened[l..].as_ptr()), "interleave, second");
        }
    }

    /// The generic `exp` (the ISAs' one) on plain lanes: within 2 ulp of `libm`.
    #[test]
    fn generic_exp_polynomial_is_within_two_ulp() {
        let s = lanes::Lanes::<16>;
        let mut xs: Vec<f32> = (0..4000).map(|i| -100.0 + i as f32 * 0.0471).collect();
        xs.extend([
            0.0,
            -0.0,
            -87.0,
            -87.4,
            -87.6,
            88.0,
            88.7,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        while !xs.len().is_multiple_of(16) {
            xs.push(1.0);
        }
        for c in xs.chunks_exact(16) {
            let mut y = [0.0f32; 16];
            // SAFETY: 16 values in and out.
            unsafe {
                vector::Simd::store(
                    s,
                    y.as_mut_ptr(),
                    vector::exp_poly(s, vector::Simd::load(s, c.as_ptr())),
                )
            };
            for (&x, &v) in c.iter().zip(&y) {
                let want = libm::expf(x);
                if x.is_nan() {
                    assert!(v.is_nan());
                } else if x < -87.5 {
                    assert!(v == 0.0 || (v - want).abs() < 1e-37, "{x}: {v}");
                } else if x > 88.0 {
                    // Documented: clamped to e^88.
                    let at88 = libm::expf(88.0);
                    assert!((v - at88).abs() <= 2.5e-7 * at88, "exp_poly({x}) = {v}");
                } else {
                    assert!(
                        (v - want).abs() <= 2.5e-7 * want,
                        "exp_poly({x}) = {v}, libm {want}"
                    );
                }
            }
        }
    }

    fn rows_len(ws: Rows<'_, '_>) -> usize {
        match ws {
            Rows::F32(w) => w.len(),
            Rows::Bf16(w) => w.len(),
        }
    }

    /// Sums of `xs` × `ws` over `0..n` through `rows_fma` or `pack_panel` + `panel_fma`, in
    /// k-blocks of `kstep` (0: one block), compacted to `[t·rows + r]`.
    fn project(
        isa: Path,
        n: usize,
        xs: &[&[f32]],
        ws: Rows<'_, '_>,
        kstep: usize,
        pack: bool,
    ) -> Vec<f32> {
        let (stride, mr) = (if pack { PANEL } else { DIRECT }, rows_len(ws));
        let mut acc = std::vec![0.0f32; xs.len() * stride];
        let mut panel = std::vec![0.0f32; n.max(1) * PANEL];
        let step = if kstep == 0 { n.max(1) } else { kstep };
        let mut k0 = 0;
        loop {
            let k1 = (k0 + step).min(n);
            if pack {
                assert!(pack_panel(isa, ws, k0, k1, &mut panel).is_ok());
                assert!(panel_fma(isa, xs, k0, k1, &panel, &mut acc).is_ok());
            } else {
                assert!(rows_fma(isa, xs, ws, k0, k1, &mut acc).is_ok());
            }
            k0 = k1;
            if k0 >= n {
                return acc.chunks(stride).flat_map(|a| a[..mr].to_vec()).collect();
            }
        }
    }

    #[test]
    fn projection_kernels_agree_bitwise_and_match_f64() {
        for isa in test_paths() {
            for n in [1usize, 7, 8, 9, 37, 300] {
                let tokens = 13;
                let xv: Vec<Vec<f32>> = (0..tokens).map(|t| rnd(n, 50 + t as u32)).collect();
                let wv: Vec<Vec<f32>> = (0..DIRECT).map(|r| rnd(n, 90 + r as u32)).collect();
                let wbv: Vec<Vec<bf16>> = wv
                    .iter()
                    .map(|w| w.iter().map(|&v| bf16::from_f32(v)).collect())
                    .collect();
                let xs: Vec<&[f32]> = xv.iter().map(|v| v.as_slice()).collect();
                let ws: Vec<&[f32]> = wv.iter().map(|v| v.as_slice()).collect();
                let wbs: Vec<&[bf16]> = wbv.iter().map(|v| v.as_slice()).collect();
                let full = project(isa, n, &xs, Rows::F32(&ws), 0, false);
                let fullb = project(isa, n, &xs, Rows::Bf16(&wbs), 0, false);
                if exact(isa) {
                    // The generic kernels over plain lanes: the reference loops' bits.
                    let r = project(Path::Reference, n, &xs, Rows::F32(&ws), 0, false);
                    let rb = project(Path::Reference, n, &xs, Rows::Bf16(&wbs), 0, false);
                    assert!(
                        same(isa, &full, &r, 0.0) && same(isa, &fullb, &rb, 0.0),
                        "{isa:?}"
                    );
                }
                for t in 0..tokens {
                    for r in 0..DIRECT {
                        let want: f64 = (0..n).map(|i| xv[t][i] as f64 * wv[r][i] as f64).sum();
                        let wantb: f64 = (0..n)
                            .map(|i| xv[t][i] as f64 * wbv[r][i].to_f32() as f64)
                            .sum();
                        assert!((full[t * DIRECT + r] as f64 - want).abs() < 1e-5 * n as f64);
                        assert!((fullb[t * DIRECT + r] as f64 - wantb).abs() < 1e-5 * n as f64);
                    }
                }
                // Any token group, row range, k-blocking and kernel: bitwise the same.
                for &(t0, t1) in &[(0, 1), (2, 5), (0, 6), (1, 13), (5, 12)] {
                    for &(r0, r1) in &[
                        (0, 1),
                        (0, 3),
                        (0, 8),
                        (0, 9),
                        (0, 16),
                        (5, 21),
                        (16, 32),
                        (0, 32),
                    ] {
                        for kstep in [0usize, 1, 8, 13, 64] {
                            for pack in [false, true] {
                                let mr = r1 - r0;
                                if pack && mr > PANEL {
                                    continue;
                                }
                                let xg = &xs[t0..t1];
                                let o = project(isa, n, xg, Rows::F32(&ws[r0..r1]), kstep, pack);
                                let ob = project(isa, n, xg, Rows::Bf16(&wbs[r0..r1]), kstep, pack);
                                for t in 0..t1 - t0 {
                                    for r in 0..mr {
                                        let (i, j) = (t * mr + r, (t0 + t) * DIRECT + r0 + r);
                                        assert_eq!(o[i].to_bits(), full[j].to_bits(), "{isa:?} n={n} t={t} r={r} mr={mr} k={kstep} pack={pack}");
                                        assert_eq!(ob[i].to_bits(), fullb[j].to_bits());
                                    }
                                }
                            }
                        }
                    }
                }
                // Short slices are refused, not read past.
                let mut acc = std::vec![0.0f32; DIRECT];
                let mut panel = std::vec![0.0f32; n * PANEL];
                assert!(rows_fma(isa, &xs[..1], Rows::F32(&ws), 0, n + 1, &mut acc).is_err());
                assert!(rows_fma(isa, &xs[..2], Rows::F32(&ws), 0, n, &mut acc).is_err());
                assert!(rows_fma(isa, &xs[..1], Rows::F32(&[]), 0, n, &mut acc).is_err());
                assert!(pack_panel(isa, Rows::F32(&ws), 0, n, &mut panel).is_err());
                assert!(pack_panel(isa, Rows::F32(&ws[..PANEL]), 0, n + 1, &mut panel).is_err());
                assert!(panel_fma(isa, &xs[..1], 0, n + 1, &panel, &mut acc).is_err());
                assert!(panel_fma(isa, &xs[..3], 0, n, &panel, &mut acc).is_err());
            }
        }
    }

    #[test]
    fn panel_layout_kernel_matches_the_row_kernels_bitwise() {
        for isa in test_paths() {
            for n in [1usize, 5, 16, 37, 130] {
                let xv: Vec<Vec<f32>> = (0..4).map(|t| rnd(n, 7 + t as u32)).collect();
                let wv: Vec<Vec<bf16>> = (0..DECODE_PANELS * PANEL)
                    .map(|r| {
                        rnd(n, 300 + r as u32)
                            .iter()
                            .map(|&v| bf16::from_f32(v))
                            .collect()
                    })
                    .collect();
                // Panel p: element (k, r) at 16k + r.
                let panels: Vec<Vec<bf16>> = (0..DECODE_PANELS)
                    .map(|p| {
                        (0..n * PANEL)
                            .map(|i| wv[p * PANEL + i % PANEL][i / PANEL])
                            .collect()
                    })
                    .collect();
                let xs: Vec<&[f32]> = xv.iter().map(|v| v.as_slice()).collect();
                let ws: Vec<&[bf16]> = wv.iter().map(|v| v.as_slice()).collect();
                let ps: Vec<&[bf16]> = panels.iter().map(|v| v.as_slice()).collect();
                for mt in 1..=4 {
                    for np in 1..=DECODE_PANELS {
                        for kstep in [0usize, 3, 16] {
                            let mut acc = std::vec![0.0f32; mt * DECODE_LD];
                            let step = if kstep == 0 { n } else { kstep };
                            let mut k0 = 0;
                            while k0 < n {
                                let k1 = (k0 + step).min(n);
                                assert!(
                                    panels_fma(isa, &xs[..mt], &ps[..np], k0, k1, &mut acc).is_ok()
                                );
                                k0 = k1;
                            }
                            for p in 0..np {
                                let want = project(
                                    isa,
                                    n,
                                    &xs[..mt],
                                    Rows::Bf16(&ws[p * PANEL..(p + 1) * PANEL]),
                                    0,
                                    true,
                                );
                                for t in 0..mt {
                                    for r in 0..PANEL {
                                        assert_eq!(
                                            acc[t * DECODE_LD + p * PANEL + r].to_bits(),
                                            want[t * PANEL + r].to_bits(),
                                            "{isa:?} n={n} mt={mt} np={np} p={p} t={t} r={r}"
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
                let mut acc = std::vec![0.0f32; 4 * DECODE_LD];
                assert!(panels_fma(isa, &xs[..1], &ps[..1], 0, n + 1, &mut acc).is_err());
                assert!(panels_fma(isa, &xs, &ps, 0, n, &mut acc[..4 * DECODE_LD - 1]).is_err());
                assert!(panels_fma(isa, &[], &ps, 0, n, &mut acc).is_err());
                let nine = [ps[0]; DECODE_PANELS + 1];
                assert!(panels_fma(isa, &xs[..1], &nine, 0, n, &mut acc).is_err());
            }
        }
    }

    #[test]
    fn prefill_panel_kernel_matches_packing_the_rows_bitwise() {
        // Token counts across the register blocks' even split (6 and 12 tokens a block),
        // one to four panels, accumulators `ld` apart with room to spare, two k-blocks.
        for isa in test_paths() {
            for n in [1usize, 16, 37] {
                let xv: Vec<Vec<f32>> = (0..30).map(|t| rnd(n, 7 + t as u32)).collect();
                let wv: Vec<Vec<bf16>> = (0..4 * PANEL)
                    .map(|r| {
                        let row = rnd(n, 300 + r as u32);
                        row.iter().map(|&v| bf16::from_f32(v)).collect()
                    })
                    .collect();
                let panels: Vec<Vec<bf16>> = (0..4)
                    .map(|p| {
                        (0..n * PANEL)
                            .map(|i| wv[p * PANEL + i % PANEL][i / PANEL])
                            .collect()
                    })
                    .collect();
                let ws: Vec<&[bf16]> = wv.iter().map(|v| v.as_slice()).collect();
                for tokens in [1usize, 5, 7, 12, 13, 25, 30] {
                    let xs: Vec<&[f32]> = xv[..tokens].iter().map(|v| v.as_slice()).collect();
                    for np in 1..=4 {
                        let ld = np * PANEL + 3;
                        let mut acc = std::vec![0.0f32; (tokens - 1) * ld + np * PANEL];
                        let h = n / 2;
                        let first: Vec<&[bf16]> =
                            panels[..np].iter().map(|p| &p[..h * PANEL]).collect();
                        let second: Vec<&[bf16]> =
                            panels[..np].iter().map(|p| &p[h * PANEL..]).collect();
                        // Each call prefetches the other half (the results must not depend on it).
                        let ok = panel_fma_bf16(isa, &xs, (0, h), &first, (&mut acc, ld), &second);
                        assert!(ok.is_ok());
                        let ok = panel_fma_bf16(isa, &xs, (h, n), &second, (&mut acc, ld), &first);
                        assert!(ok.is_ok());
                        for p in 0..np {
                            let rows = Rows::Bf16(&ws[p * PANEL..(p + 1) * PANEL]);
                            let want = project(isa, n, &xs, rows, 0, true);
                            for t in 0..tokens {
                                for r in 0..PANEL {
                                    assert_eq!(
                                        acc[t * ld + p * PANEL + r].to_bits(),
                                        want[t * PANEL + r].to_bits(),
                                        "{isa:?} n={n} tokens={tokens} np={np} p={p} t={t} r={r}"
                                    );
                                }
                            }
                        }
                        // Short slices and a stride under the group's width are refused.
                        let bad_steps =
                            panel_fma_bf16(isa, &xs, (h, n + 1), &second, (&mut acc, ld), &[]);
                        assert!(bad_steps.is_err());
                        let narrow =
                            panel_fma_bf16(isa, &xs, (h, n), &second, (&mut acc, ld - 4), &[]);
                        assert!(narrow.is_err());
                        let short = acc.len() - 1;
                        let bad_acc =
                            panel_fma_bf16(isa, &xs, (h, n), &second, (&mut acc[..short], ld), &[]);
                        assert!(bad_acc.is_err());
                    }
                }
            }
        }
    }

    #[test]
    fn exp_paths_agree_and_handle_extremes() {
        let mut xs: Vec<f32> = (0..2000).map(|i| -100.0 + i as f32 * 0.0937).collect();
        xs.extend([
            0.0,
            -0.0,
            -87.0,
            -87.6,
            -1000.0,
            80.0,
            88.0,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        for isa in test_paths() {
            let mut y = xs.clone();
            exp_in_place(isa, &mut y);
            for (&x, &v) in xs.iter().zip(&y) {
                // Vectors taken in lockstep give the bits of one taken alone (a 1-lane tail).
                let mut alone = [x];
                exp_in_place(isa, &mut alone);
                assert!(
                    v.to_bits() == alone[0].to_bits() || v.is_nan() && alone[0].is_nan(),
                    "{isa:?} exp({x}): {v} in a slice, {} alone",
                    alone[0]
                );
                let want = libm::expf(x);
                if exact(isa) {
                    assert!(v.to_bits() == want.to_bits() || v.is_nan() && want.is_nan());
                } else if x.is_nan() {
                    assert!(v.is_nan());
                } else if x < -87.5 {
                    assert!(v == 0.0 || (v - want).abs() < 1e-37, "{x}: {v}");
                } else {
                    assert!(
                        (v - want).abs() <= 2.5e-7 * want,
                        "{isa:?} exp({x}) = {v}, libm {want}"
                    );
                }
            }
        }
    }

    /// Activations rounded to bf16 pairs, as the bf16 mode's layer does.
    fn pair_rows(tokens: usize, n: usize, seed: u32) -> Vec<Vec<u32>> {
        (0..tokens)
            .map(|t| {
                let x = rnd(n, seed + t as u32);
                let mut p = std::vec![0u32; n.div_ceil(2)];
                round_pairs_row(Path::Reference, &x, &mut p).unwrap();
                p
            })
            .collect()
    }

    /// The bf16 pair kernels give the reference loops' bits on every path (the native
    /// `vdpbf16ps` included: these values keep every partial sum normal), for any split of
    /// the pairs into calls, and decode (`pairs_panels_fma`) equals prefill
    /// (`pairs_panel_fma`) bitwise.
    #[test]
    fn pair_kernels_match_reference_bitwise() {
        for path in test_paths() {
            for n in [1usize, 2, 3, 15, 16, 17, 33, 64, 255, 300] {
                let panels: Vec<Vec<bf16>> = (0..DECODE_PANELS as u32)
                    .map(|p| {
                        rnd(n * PANEL, 40 + p)
                            .iter()
                            .map(|&v| bf16::from_f32(v))
                            .collect()
                    })
                    .collect();
                let pr: Vec<&[bf16]> = panels.iter().map(|p| &p[..]).collect();
                let all = PairSteps::all(n);
                for tokens in [1usize, 2, 3, 4, 5, 11, 12, 13, 25] {
                    let rows = pair_rows(tokens, n, 7 * n as u32);
                    let xs: Vec<&[u32]> = rows.iter().map(|r| &r[..]).collect();
                    let start = rnd(tokens * PANEL, 3);
                    let mut want = start.clone();
                    portable::pairs_panels_fma(&xs, &pr[..1], all.tuple(), &mut want, PANEL);
                    let mut got = start.clone();
                    let mid = all.j1 / 3;
                    let halves = [PairSteps { j1: mid, ..all }, PairSteps { j0: mid, ..all }];
                    for st in halves {
                        pairs_panel_fma(path, &xs, st, &pr[..1], (&mut got, PANEL), &[]).unwrap();
                    }
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(g, w)| g.to_bits() == w.to_bits());
                    assert!(same, "{path:?} pairs_panel_fma n={n} tokens={tokens}");
                    // Three panels in one call, tokens `ld` apart: each panel's sums as alone.
                    let ld = 3 * PANEL + 5;
                    let mut three = std::vec![0.0f32; (tokens - 1) * ld + 3 * PANEL];
                    // Prefetching the other panels on the way must not change a bit.
                    let ahead = &pr[3..6];
                    pairs_panel_fma(path, &xs, all, &pr[..3], (&mut three, ld), ahead).unwrap();
                    let short = three.len() - 1;
                    let cut =
                        pairs_panel_fma(path, &xs, all, &pr[..3], (&mut three[..short], ld), &[]);
                    assert!(cut.is_err());
                    let narrow =
                        pairs_panel_fma(path, &xs, all, &pr[..3], (&mut three, ld - 6), &[]);
                    assert!(narrow.is_err());
                    for p in 0..3 {
                        let mut one = std::vec![0.0f32; tokens * PANEL];
                        let st = all.tuple();
                        portable::pairs_panels_fma(&xs, &pr[p..p + 1], st, &mut one, PANEL);
                        for t in 0..tokens {
                            let got = &three[t * ld + p * PANEL..][..PANEL];
                            let ok = got
                                .iter()
                                .zip(&one[t * PANEL..(t + 1) * PANEL])
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(ok, "{path:?} three panels: {p} n={n} t={t}/{tokens}");
                        }
                    }
                    if tokens > 4 {
                        continue;
                    }
                    for np in 1..=DECODE_PANELS {
                        let mut acc = std::vec![0.0f32; tokens * DECODE_LD];
                        pairs_panels_fma(path, &xs, &pr[..np], all, &mut acc).unwrap();
                        for p in 0..np {
                            let mut one = std::vec![0.0f32; tokens * PANEL];
                            let one_acc = (&mut one[..], PANEL);
                            pairs_panel_fma(Path::Reference, &xs, all, &pr[p..p + 1], one_acc, &[])
                                .unwrap();
                            for t in 0..tokens {
                                let d = &acc[t * DECODE_LD + p * PANEL..][..PANEL];
                                let ok = d
                                    .iter()
                                    .zip(&one[t * PANEL..(t + 1) * PANEL])
                                    .all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(ok, "{path:?} pairs_panels_fma n={n} t={t} p={p}/{np}");
                            }
                        }
                    }
                }
            }
            let mut acc = std::vec![0.0f32; PANEL];
            let bad = PairSteps {
                j1: 3,
                ..PairSteps::all(4)
            };
            let w: &[bf16] = &[bf16::ZERO; 64];
            assert!(
                pairs_panel_fma(path, &[&[0u32; 3]], bad, &[w], (&mut acc, PANEL), &[]).is_err()
            );
        }
    }

    /// Rounding to bf16 pairs: every path bitwise equal to the scalar rule, which is
    /// `half`'s round-to-nearest-even for normal values, with subnormals to signed zero and
    /// NaN kept a NaN.
    #[test]
    fn round_pairs_every_path() {
        let mut xs: Vec<f32> = rnd(1000, 5).iter().map(|v| v * 1e3).collect();
        xs.extend([
            0.0,
            -0.0,
            1.0e-40,
            -1.0e-40,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::from_bits(0x3f80_8001),
        ]);
        for &x in &xs {
            let r = vector::round_bf16(x);
            if x.is_nan() {
                assert!(bf16::from_bits(r).is_nan());
            } else if x.is_subnormal() {
                assert_eq!(r, (x.to_bits() >> 16) as u16 & 0x8000);
            } else {
                assert_eq!(r, bf16::from_f32(x).to_bits(), "{x:e}");
            }
        }
        for path in test_paths() {
            for n in [0usize, 1, 2, 31, 32, 33, 63, xs.len()] {
                let (mut want, mut got) = (
                    std::vec![0u32; n.div_ceil(2)],
                    std::vec![1u32; n.div_ceil(2)],
                );
                portable::round_pairs_row(&xs[..n], &mut want);
                round_pairs_row(path, &xs[..n], &mut got).unwrap();
                assert_eq!(got, want, "{path:?} round_pairs_row n={n}");
            }
        }
        assert!(round_pairs_row(Path::Reference, &xs[..3], &mut [0u32; 1]).is_err());
    }

    #[test]
    fn dot_pairs_peak_does_the_work_it_counts() {
        // Every multiply-add adds c² (c = bf16(1e-3)) to a chain, so the chains' total is the
        // count times c², up to f32 rounding over ~1000 steps per chain.
        let c = f64::from(half::bf16::from_f32(1e-3).to_f32());
        for isa in test_paths().into_iter().chain([Path::Reference]) {
            let (macs, total) = dot_pairs_peak(isa, 1000);
            assert!(macs >= 1000 && macs % 1000 == 0, "{isa:?}: {macs}");
            let want = macs as f64 * c * c;
            let err = (f64::from(total) - want).abs() / want;
            if isa == Path::Reference {
                // The reference path runs the f32 FMA probe (x ← 0.999999·x + 1e-7 from 1).
                assert!(total.is_finite() && total > 0.0, "{isa:?}: {total}");
            } else {
                assert!(
                    err < 1e-3,
                    "{isa:?}: {total} vs {want} ({macs} multiply-adds)"
                );
            }
        }
    }

    #[test]
    fn read_probe_sums_everything_once() {
        for isa in test_paths().into_iter().chain([Path::Reference]) {
            for n in [0usize, 5, 64, 1000, 4096 + 77] {
                // Small integers: every order sums them exactly, and read as bf16 halves each
                // is (0, itself), so both loads give the same sum.
                let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
                let want: f32 = data.iter().sum();
                for streams in [1, 4, 8] {
                    for prefetch in [false, true] {
                        for loads in [ReadLoads::Widest, ReadLoads::Bf16] {
                            let got = read_sum(isa, &data, streams, prefetch, loads);
                            assert_eq!(got, want, "{isa:?} n={n} streams={streams} {loads:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn transpose_every_shape() {
        for isa in test_paths() {
            for &(r, c) in &[
                (1usize, 1usize),
                (8, 8),
                (9, 17),
                (16, 128),
                (64, 3),
                (3, 64),
            ] {
                let src = rnd(r * (c + 1), 21);
                let mut dst = std::vec![0.0; c * (r + 2)];
                assert!(transpose(isa, r, c, &src, c + 1, &mut dst, r + 2).is_ok());
                for i in 0..r {
                    for j in 0..c {
                        assert_eq!(dst[j * (r + 2) + i], src[i * (c + 1) + j]);
                    }
                }
                // With the scaled copy: the same transpose, and each product bit for bit.
                let scales = rnd(c, 22);
                let (mut plain, mut scaled) =
                    (std::vec![0.0; dst.len()], std::vec![0.0; dst.len()]);
                let shape = ((r, c), (&src[..], c + 1), (&mut plain[..], r + 2));
                assert!(
                    transpose_scaled(isa, shape.0, shape.1, shape.2, (&mut scaled, &scales))
                        .is_ok()
                );
                assert_eq!(plain, dst, "{isa:?} {r}x{c}");
                for i in 0..r {
                    for j in 0..c {
                        let want = scales[j] * src[i * (c + 1) + j];
                        let got = scaled[j * (r + 2) + i];
                        assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} {r}x{c} ({i}, {j})");
                    }
                }
                // A second output or scales too short: an error, nothing written.
                let mut short = std::vec![0.0; (c - 1) * (r + 2) + r - 1];
                let args = ((r, c), (&src[..], c + 1), (&mut plain[..], r + 2));
                assert!(
                    transpose_scaled(isa, args.0, args.1, args.2, (&mut short, &scales)).is_err()
                );
                assert!(short.iter().all(|&x| x == 0.0));
                let args = ((r, c), (&src[..], c + 1), (&mut plain[..], r + 2));
                let few = &scales[..c - 1];
                assert!(transpose_scaled(isa, args.0, args.1, args.2, (&mut scaled, few)).is_err());
            }
        }
    }

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

    /// `tame_rows` on every path: the reference's bits given the path's `exp` (every other
    /// operation is the same, in the same order), over shapes with column tails, strided
    /// inputs and one row; a spread past the limit, or a NaN, makes the chunk not tame.
    #[test]
    fn tame_rows_match_the_reference_bitwise() {
        struct Outs([Vec<f32>; 9]);
        impl Outs {
            fn new(l: usize, kd: usize) -> Self {
                Outs(core::array::from_fn(
                    |j| std::vec![f32::NAN; if j < 5 { l * kd } else { kd }],
                ))
            }
            fn view(&mut self) -> TameOut<'_> {
                let [qf, kf, kb, qd, kd, first, last, hi, lo] = &mut self.0;
                TameOut {
                    qf,
                    kf,
                    kb,
                    qd,
                    kd,
                    first,
                    last,
                    hi,
                    lo,
                }
            }
        }
        let bits = |o: &Outs| -> Vec<u32> { o.0.iter().flatten().map(|v| v.to_bits()).collect() };
        for path in test_paths() {
            let path_exp = |x: f32| {
                let mut e = [x];
                exp_in_place(path, &mut e);
                e[0]
            };
            for &(l, kd) in &[
                (1usize, 1usize),
                (3, 5),
                (7, 33),
                (16, 17),
                (16, 64),
                (16, 128),
            ] {
                let ld = kd + 3;
                let (q, k) = (rnd(l * ld, 31), rnd(l * ld, 32));
                let mut g: Vec<f32> = rnd(l * ld, 33).iter().map(|u| -0.3 * (1.5 + u)).collect();
                for (spill, want) in [(0.0f32, true), (-90.0, false), (f32::NAN, false)] {
                    if spill != 0.0 {
                        g[(l - 1) * ld + kd - 1] = spill;
                    }
                    let i = TameIn {
                        q: (&q, ld),
                        k: (&k, ld),
                        g: (&g, ld),
                        rows: l,
                        dim: kd,
                        scale: 0.125,
                        limit: 80.0,
                    };
                    let (mut got, mut exp_ref) = (Outs::new(l, kd), Outs::new(l, kd));
                    let tame = tame_rows(path, &i, &mut got.view()).unwrap();
                    let tame_ref = portable::tame_rows_with(&i, &mut exp_ref.view(), path_exp);
                    // One row has no spread: its chunk is always tame.
                    let want = want || l == 1 && !spill.is_nan();
                    assert_eq!(
                        (tame, tame_ref),
                        (want, want),
                        "{path:?} {l}x{kd} g={spill}"
                    );
                    if want {
                        assert_eq!(bits(&got), bits(&exp_ref), "{path:?} {l}x{kd}");
                    }
                }
            }
        }
        let short = TameIn {
            q: (&[0.0; 3], 3),
            k: (&[0.0; 3], 3),
            g: (&[0.0; 2], 3),
            rows: 1,
            dim: 3,
            scale: 1.0,
            limit: 80.0,
        };
        let mut o = Outs::new(1, 3);
        assert!(tame_rows(Isa::detect(), &short, &mut o.view()).is_err());
    }

    /// Every row count from 1 to 40 (the 12-, 6- and merged 4/5-row splits, and the 4-row
    /// blocks of a short reduction): the whole GEMM equals one call per row, bitwise, so each
    /// row is covered once and the blocking changes nothing.
    #[test]
    fn gemm_row_blocks_cover_every_row_bitwise() {
        // Lanes(4) takes the short-reduction blocks on any machine.
        assert!(short_gemm(Path::Lanes(4), 16, 64) && !short_gemm(Path::Lanes(4), 19, 40));
        for isa in test_paths() {
            for (n, k) in [(40, 19), (64, 16)] {
                gemm_rows_bitwise(isa, n, k);
            }
        }
    }

    fn gemm_rows_bitwise(isa: Path, n: usize, k: usize) {
        let b = rnd(k * n, 5);
        for m in 1..=40 {
            let a = rnd(m * k, 6);
            let c0 = rnd(m * n, 7);
            let mut whole = c0.clone();
            assert!(gemm_acc(isa, m, n, k, &a, k, &b, n, &mut whole, n).is_ok());
            let mut by_row = c0.clone();
            for (ar, cr) in a.chunks_exact(k).zip(by_row.chunks_exact_mut(n)) {
                assert!(gemm_acc(isa, 1, n, k, ar, k, &b, n, cr, n).is_ok());
            }
            let same = whole
                .iter()
                .zip(&by_row)
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{isa:?} m = {m}");
            assert_ne!(whole, c0, "{isa:?} m = {m}: nothing accumulated");
        }
    }

    /// `Zero` and `ScaledRows` starts equal a separate fill / scaling pass followed by
    /// `gemm_acc`, bitwise, on every path (column tails and an empty reduction included).
    #[test]
    fn gemm_starts_equal_a_separate_pass_bitwise() {
        for isa in test_paths() {
            for &(m, n, k) in &[
                (16usize, 128usize, 16usize),
                (7, 64, 16),
                (7, 37, 5),
                (32, 20, 1),
                (5, 9, 0),
            ] {
                let (lda, ldb, ldc) = (k + 1, n + 2, n + 3);
                let a = rnd(m * lda, 21);
                let b = rnd(k * ldb, 22);
                let c0 = rnd(m * ldc, 23);
                let f = rnd(m, 24);
                for start in [CStart::Zero, CStart::ScaledRows(&f)] {
                    let mut fused = c0.clone();
                    let r = gemm(
                        isa,
                        start,
                        (m, n, k),
                        (&a, lda),
                        (&b, ldb),
                        (&mut fused, ldc),
                    );
                    assert!(r.is_ok());
                    let mut apart = c0.clone();
                    for (i, row) in apart.chunks_exact_mut(ldc).enumerate() {
                        for x in &mut row[..n] {
                            *x = if let CStart::ScaledRows(f) = start {
                                *x * f[i]
                            } else {
                                0.0
                            };
                        }
                    }
                    if k > 0 {
                        let r = gemm_acc(isa, m, n, k, &a, lda, &b, ldb, &mut apart, ldc);
                        assert!(r.is_ok());
                    }
                    let same = fused
                        .iter()
                        .zip(&apart)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{isa:?} {start:?} {m}x{n}x{k}");
                }
                let short = CStart::ScaledRows(&f[..m - 1]);
                let mut c = c0.clone();
                let r = gemm(isa, short, (m, n, k), (&a, lda), (&b, ldb), (&mut c, ldc));
                assert!(r.is_err() && c == c0, "{isa:?}: too few row scales");
            }
        }
    }

    #[test]
    fn gemm_matches_triple_loop() {
        for isa in test_paths() {
            for &(m, n, k) in &[
                (1usize, 1usize, 1usize),
                (4, 16, 8),
                (5, 17, 3),
                (16, 128, 128),
                (7, 33, 70),
                (64, 40, 9),
                (7, 64, 16),
                (9, 128, 5),
            ] {
                let (lda, ldb, ldc) = (k + 2, n + 1, n + 3);
                let a = rnd(m * lda, 11);
                let b = rnd(k * ldb, 12);
                let mut c = rnd(m * ldc, 13);
                let mut want: Vec<f64> = c.iter().map(|&v| v as f64).collect();
                for i in 0..m {
                    for j in 0..n {
                        for p in 0..k {
                            want[i * ldc + j] += a[i * lda + p] as f64 * b[p * ldb + j] as f64;
                        }
                    }
                }
                assert!(gemm_acc(isa, m, n, k, &a, lda, &b, ldb, &mut c, ldc).is_ok());
                for i in 0..m {
                    for j in 0..ldc {
                        let w = want[i * ldc + j];
                        assert!(
                            (c[i * ldc + j] as f64 - w).abs() < 1e-4,
                            "{isa:?} {m}x{n}x{k} [{i},{j}]"
                        );
                    }
                }
                assert!(
                    gemm_acc(isa, m, n, k, &a[..1], lda, &b, ldb, &mut c, ldc).is_err()
                        || m * k <= 1
                );
            }
        }
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

    /// CPUID's vendor and family, as read by [`amd_family`], agree with what Linux reports.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    fn amd_family_matches_proc_cpuinfo() {
        let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
            println!("skipped: no /proc/cpuinfo");
            return;
        };
        let field = |name: &str| {
            info.lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(name))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        };
        let family: Option<u32> = field("cpu family").and_then(|f| f.parse().ok());
        let amd = field("vendor_id").as_deref() == Some("AuthenticAMD");
        assert_eq!(amd_family(), family.filter(|_| amd));
        assert_eq!(split_512_bit_fma(), amd && family == Some(0x19));
    }
}
