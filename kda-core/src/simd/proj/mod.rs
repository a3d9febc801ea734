//! The projections' kernels: the layout both sides read ([`PANEL`]-row panels, up to
//! [`DIRECT`](super::DIRECT) weight rows, bf16 pairs; the constants are in `types.rs`, which
//! the reference loops read too) and the bf16 mode's rounding of the inputs here; prefill
//! (`prefill.rs`: a packed or panel-layout panel reused by every token) and decode
//! (`decode.rs`: up to [`DECODE_PANELS`](super::DECODE_PANELS) panels or
//! [`DIRECT`](super::DIRECT) rows streamed for a few tokens) in their files; their tests,
//! which check each against the other, in `tests.rs`.

pub(super) mod decode;
pub(super) mod prefill;
#[cfg(test)]
mod tests;

pub use decode::{pairs_panels_fma, panels_fma, rows_fma};
pub use prefill::{pack_panel, pairs_panel_fma, panel_fma, panel_fma_bf16};

use half::bf16;

use super::types::PANEL;
use super::{bad, dispatch, portable, Path};
use crate::error::KdaError;

/// Weight rows of a projection tile, f32 or bf16: up to [`PANEL`] for [`pack_panel`], up to
/// [`DIRECT`](super::DIRECT) for [`rows_fma`].
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

/// Rounds a row of activations to bf16 pairs for the bf16 mode: `out[j]` packs `x[2j]` (low 16
/// bits) and `x[2j + 1]` (0 past the end), each rounded to nearest even with subnormals to zero, as
/// `vcvtne2ps2bf16` does (and does natively on [`Isa::Avx512Bf16`](crate::Isa::Avx512Bf16); bitwise
/// the same on every path). `out` must be `x.len().div_ceil(2)` long, else an
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

/// The kernels shared by prefill and decode, and the input rounding, generic over the ISA
/// token and `#[inline(always)]` (see the contract in the `simd` module docs).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64", test)),
    allow(dead_code, unused_macros, unused_imports)
)]
pub(crate) mod kernels {
    use half::bf16;

    use crate::simd::types::PANEL;
    use crate::simd::vector::{round_pair, Simd};

    /// Row pointers of a tile of weight rows, the last row repeated to fill `N`.
    #[inline(always)]
    pub(crate) fn row_ptrs<W, const N: usize>(ws: &[&[W]]) -> [*const W; N] {
        core::array::from_fn(|r| ws[r.min(ws.len() - 1)].as_ptr())
    }

    /// At most this many vectors per 16 outputs (4-lane ISAs).
    pub(crate) const MAX_PER_PANEL: usize = 4;

    /// A row of zeros: the odd half of the last pair when a panel has an odd number of steps.
    static ZERO_ROW: [bf16; PANEL] = [bf16::ZERO; PANEL];

    /// Where pair `j` of a panel lies: its two rows, the second a zero row for the `tail` pair
    /// of a panel with an odd number of steps. Callers pass a literal `tail`, so the main loop
    /// compiles to adjacent rows with no test.
    #[inline(always)]
    pub(crate) unsafe fn pair_rows(
        panel: *const bf16,
        j: usize,
        tail: bool,
    ) -> (*const bf16, *const bf16) {
        let lo = panel.add(2 * j * PANEL);
        let hi = if tail {
            ZERO_ROW.as_ptr()
        } else {
            lo.add(PANEL)
        };
        (lo, hi)
    }

    /// Pairs `j0..j1` of a panel of `n` steps as (the whole pairs, the half pair at the end of an
    /// odd `n` if it is in range).
    #[inline(always)]
    pub(crate) fn pair_split(
        (j0, j1, n): (usize, usize, usize),
    ) -> (core::ops::Range<usize>, core::ops::Range<usize>) {
        let full = j1.min(n / 2).max(j0);
        (j0..full, full..j1)
    }

    /// `out[j]` = `x[2j]`, `x[2j + 1]` rounded to bf16 and packed ([`Simd::round_pairs`]; a
    /// missing last odd element is 0). `out` is `x.len().div_ceil(2)` long.
    #[inline(always)]
    pub(crate) unsafe fn round_pairs_row<S: Simd>(s: S, x: &[f32], out: &mut [u32]) {
        let l = S::LANES;
        let (xp, op) = (x.as_ptr(), out.as_mut_ptr());
        let mut j = 0;
        while 2 * (j + l) <= x.len() {
            s.round_pairs(xp.add(2 * j), op.add(j));
            j += l;
        }
        for (j, o) in out.iter_mut().enumerate().skip(j) {
            *o = round_pair(x[2 * j], x.get(2 * j + 1).copied().unwrap_or(0.0));
        }
    }

    /// The entry points of this file's kernels for the token `$token`, each with
    /// `#[target_feature(enable = $features)]` when given (see `simd::instantiate!`).
    macro_rules! entry_points {
        ($token:expr $(, $features:literal)?) => {
            $(#[target_feature(enable = $features)])?
            pub(crate) unsafe fn round_pairs_row(x: &[f32], out: &mut [u32]) {
                $crate::simd::proj::kernels::round_pairs_row($token, x, out)
            }
        };
    }
    pub(crate) use entry_points;
}

crate::simd::instantiate!();
