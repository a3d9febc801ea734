//! The types and constants that the safe wrappers, the kernels and the reference loops
//! (`portable.rs`) share: the projections' panel layout, the GEMM's start modes, the tame
//! chunk's rows in and out, and the read probe's loads.

/// Outputs per packed panel ([`pack_panel`](super::pack_panel),
/// [`panel_fma`](super::panel_fma)): the panel's width and the accumulator row stride.
pub const PANEL: usize = crate::weights::PANEL_ROWS;

/// Most weight rows per [`rows_fma`](super::rows_fma) call, and its accumulator row stride.
pub const DIRECT: usize = 32;

/// Most 16-row panels per call of the decode kernels (`panels_fma`, `pairs_panels_fma`): the
/// rows of a decode tile are `DECODE_PANELS · 16`.
pub const DECODE_PANELS: usize = 8;

/// The decode kernels' accumulator row stride per token, `acc[t·DECODE_LD + 16p + r]`; also
/// the rows of one decode tile.
pub const DECODE_LD: usize = DECODE_PANELS * PANEL;

/// What `C` holds before a GEMM adds `A·B` to it (see [`gemm`](super::gemm())).
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

/// The inputs of [`tame_rows`](super::tame_rows): `rows` rows of `dim` of `q`, `k` and the
/// log-decays `g`, each with its row stride.
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

/// The outputs of [`tame_rows`](super::tame_rows): `[rows, dim]` row-major but `first` and
/// `last` (`[dim]`).
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

/// f32 per piece of [`read_sum`](super::read_sum): 256 bytes, four cache lines.
pub(crate) const READ_PIECE: usize = 64;

/// Weights per GGUF `Q8_0` block ([`dot_q8_0`](super::dot_q8_0)).
pub const Q8_0_ELEMS: usize = 32;
/// Bytes per GGUF `Q8_0` block: the f16 scale, then 32 int8 quants.
pub const Q8_0_BYTES: usize = 34;
