//! Borrowed weight views in checkpoint layout (`[out, in]` row-major), per storage format.
//!
//! Nothing here copies: the views borrow the caller's bytes (a memory-mapped checkpoint, a
//! `const` array in flash). Matrices and small parameters may be f32, bf16, f16 or int8 with
//! per-row scales ([`Data::I8`], see [`crate::quant`]); matrices may also be GGUF blocks
//! ([`Data::Blocks`]) or compressed-tensors groups ([`Data::Groups`]). Every product
//! accumulates in f32.

use half::{bf16, f16};

use crate::config::{DecayGate, GateProj, KdaConfig};
use crate::error::{check_len, KdaError};
use crate::quant::{Blocks, GroupRows};

/// A borrowed run of numbers in one of the supported storage formats.
#[derive(Debug, Clone, Copy)]
pub enum Data<'a> {
    /// IEEE f32.
    F32(&'a [f32]),
    /// bfloat16 (how the Kimi checkpoints ship their matrices).
    Bf16(&'a [bf16]),
    /// IEEE f16.
    F16(&'a [f16]),
    /// Symmetric int8 with one f32 scale per row: element `i` is `data[i] · scales[i / r]`,
    /// `r = data.len() / scales.len()` (for a matrix `[rows, cols]` with per-output-row scales,
    /// `scales.len() == rows` and `r == cols`). Written by [`crate::quant::quantize_rows`].
    /// Malformed (`scales` empty while `data` is not, or not dividing its length), it reports
    /// [`Data::len`] 0, so every shape check rejects it.
    I8 {
        /// The int8 values, row-major.
        data: &'a [i8],
        /// One scale per row.
        scales: &'a [f32],
    },
    /// GGUF block-quantised weights (Q4_0 … Q6_K), as stored: a matrix row is a whole number of
    /// blocks. For matrices only.
    Blocks(Blocks<'a>),
    /// compressed-tensors `pack-quantized` int4 / int8 groups, as stored. For matrices only.
    Groups(GroupRows<'a>),
}

impl<'a> Data<'a> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(s) => s.len(),
            Data::Bf16(s) => s.len(),
            Data::F16(s) => s.len(),
            Data::I8 { data, scales } => {
                i8_row_len(data.len(), scales.len()).map_or(0, |_| data.len())
            }
            Data::Blocks(b) => b.len(),
            Data::Groups(g) => g.len(),
        }
    }

    /// Whether this is one of the quantised matrix formats ([`Data::Blocks`], [`Data::Groups`]),
    /// which the small parameters (convs, gates' biases, norms) may not use.
    pub fn is_block_quantised(&self) -> bool {
        matches!(self, Data::Blocks(_) | Data::Groups(_))
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f32, or `None` past the end.
    #[inline]
    pub fn get(&self, i: usize) -> Option<f32> {
        match self {
            Data::Blocks(b) => b.get(i),
            Data::Groups(g) => g.get(i),
            _ => self.get_dense(i),
        }
    }

    /// Element `i` of a dense format (f32, bf16, f16, int8 rows) widened to f32; `None` out of
    /// range or for block and group formats. For code that has already refused quantised
    /// formats (small parameter vectors, the integer path): it does not link the block
    /// decoders, which keeps a microcontroller build small.
    pub(crate) fn get_dense(&self, i: usize) -> Option<f32> {
        match self {
            Data::F32(s) => s.get(i).copied(),
            Data::Bf16(s) => s.get(i).map(|v| v.to_f32()),
            Data::F16(s) => s.get(i).map(|v| v.to_f32()),
            Data::I8 { data, scales } => {
                let r = i8_row_len(data.len(), scales.len())?;
                Some(*data.get(i)? as f32 * scales[i / r])
            }
            Data::Blocks(_) | Data::Groups(_) => None,
        }
    }

    /// Element `i` widened to f32. The caller guarantees `i < len()` (shapes are validated
    /// before any kernel runs).
    #[inline(always)]
    pub(crate) fn at(&self, i: usize) -> f32 {
        match self {
            Data::F32(s) => s[i],
            Data::Bf16(s) => s[i].to_f32(),
            Data::F16(s) => s[i].to_f32(),
            Data::I8 { data, scales } => {
                let s = if scales.len() == 1 {
                    scales[0]
                } else {
                    scales[i / (data.len() / scales.len())]
                };
                data[i] as f32 * s
            }
            Data::Blocks(b) => b.get(i).unwrap_or(f32::NAN),
            Data::Groups(g) => g.get(i).unwrap_or(f32::NAN),
        }
    }

    /// The sub-range `start..start + len` (caller guarantees it is in bounds).
    #[inline]
    pub(crate) fn slice(&self, start: usize, len: usize) -> Data<'a> {
        match *self {
            Data::F32(s) => Data::F32(&s[start..start + len]),
            Data::Bf16(s) => Data::Bf16(&s[start..start + len]),
            Data::F16(s) => Data::F16(&s[start..start + len]),
            Data::I8 { data, scales } => slice_i8(data, scales, start, len),
            Data::Blocks(b) => match b.slice(start, len) {
                Some(v) => Data::Blocks(v),
                None => {
                    debug_assert!(false, "block-quantised slice off the block grid");
                    Data::F32(&[])
                }
            },
            Data::Groups(g) => match g.slice(start, len) {
                Some(v) => Data::Groups(v),
                None => {
                    debug_assert!(false, "group-quantised slice off the row grid");
                    Data::F32(&[])
                }
            },
        }
    }
}

/// Rows per panel of the panel layout ([`MatRef::new_panels`]).
pub const PANEL_ROWS: usize = 16;

/// bf16 elements of a `[rows, cols]` matrix in the panel layout (rows padded to a multiple of
/// [`PANEL_ROWS`]), or `None` on overflow.
pub fn panels_len(rows: usize, cols: usize) -> Option<usize> {
    rows.div_ceil(PANEL_ROWS)
        .checked_mul(PANEL_ROWS)?
        .checked_mul(cols)
}

/// Repacks a row-major bf16 matrix into the panel layout of [`MatRef::new_panels`] (padding
/// rows are zero). `dst` must be [`panels_len`] long.
pub fn pack_panels(m: &MatRef<'_>, dst: &mut [bf16]) -> Result<(), KdaError> {
    let (rows, cols) = (m.rows, m.cols);
    let Data::Bf16(src) = m.data else {
        return Err(KdaError::Weights {
            arg: "pack_panels",
            reason: "the panel layout holds bf16 matrices only",
        });
    };
    if m.panels {
        return Err(KdaError::Weights {
            arg: "pack_panels",
            reason: "the matrix is already in the panel layout",
        });
    }
    let n = panels_len(rows, cols).ok_or(KdaError::Overflow {
        what: "pack_panels",
    })?;
    check_len("pack_panels dst", dst.len(), n)?;
    for (p, panel) in dst.chunks_exact_mut(PANEL_ROWS * cols.max(1)).enumerate() {
        for r in 0..PANEL_ROWS {
            let o = p * PANEL_ROWS + r;
            for k in 0..cols {
                panel[k * PANEL_ROWS + r] = if o < rows {
                    src[o * cols + k]
                } else {
                    bf16::ZERO
                };
            }
        }
    }
    Ok(())
}

/// A borrowed matrix `[rows, cols]`: row-major (PyTorch `nn.Linear` layout: `[out, in]`), or
/// (bf16 only) in the **panel layout**: groups of 16 rows stored column by column, element
/// `(o, k)` at `(o / 16)·16·cols + 16·k + o % 16`, the last group padded with zero rows. The
/// panel layout is what the CPU projection kernels stream best: decode reads 16 outputs'
/// weights for one input as one 32-byte load, and prefill needs no packing. Results are
/// bitwise the same in either layout.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    data: Data<'a>,
    rows: usize,
    cols: usize,
    panels: bool,
}

impl<'a> MatRef<'a> {
    /// Wraps row-major `data` as `[rows, cols]`; errors (naming `name`) unless
    /// `data.len() == rows·cols`.
    pub fn new(
        name: &'static str,
        data: Data<'a>,
        rows: usize,
        cols: usize,
    ) -> Result<Self, KdaError> {
        let n = rows
            .checked_mul(cols)
            .ok_or(KdaError::Overflow { what: name })?;
        check_len(name, data.len(), n)?;
        match data {
            Data::Blocks(b) if !cols.is_multiple_of(b.format().block_elems()) => {
                return Err(KdaError::Weights {
                    arg: name,
                    reason: "a block-quantised matrix's rows must be whole blocks",
                })
            }
            Data::Groups(g) if g.cols() != cols || g.rows() != rows => {
                return Err(KdaError::Shape {
                    arg: name,
                    expected: [rows, cols],
                    actual: [g.rows(), g.cols()],
                })
            }
            _ => {}
        }
        Ok(MatRef {
            data,
            rows,
            cols,
            panels: false,
        })
    }

    /// Wraps bf16 `data` in the panel layout (see [`MatRef`]; made by [`pack_panels`]) as
    /// `[rows, cols]`; errors unless it is bf16 and [`panels_len`] long.
    pub fn new_panels(
        name: &'static str,
        data: Data<'a>,
        rows: usize,
        cols: usize,
    ) -> Result<Self, KdaError> {
        if !matches!(data, Data::Bf16(_)) {
            return Err(KdaError::Weights {
                arg: name,
                reason: "the panel layout holds bf16 matrices only",
            });
        }
        let n = panels_len(rows, cols).ok_or(KdaError::Overflow { what: name })?;
        check_len(name, data.len(), n)?;
        Ok(MatRef {
            data,
            rows,
            cols,
            panels: true,
        })
    }

    /// Whether the matrix is in the panel layout.
    pub fn is_panels(&self) -> bool {
        self.panels
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The elements, in the matrix's layout ([`MatRef::is_panels`]).
    pub fn data(&self) -> Data<'a> {
        self.data
    }

    /// Panel `p` (rows `16p..16p + 16`) of a panel-layout matrix, `16·cols` long; empty if
    /// the matrix is row-major or `p` is out of range.
    #[inline]
    pub(crate) fn panel(&self, p: usize) -> &'a [bf16] {
        match self.data {
            Data::Bf16(s) if self.panels => {
                let len = PANEL_ROWS * self.cols;
                s.get(p * len..(p + 1) * len).unwrap_or(&[])
            }
            _ => &[],
        }
    }

    /// Row `r` of a row-major matrix (caller guarantees `r < rows` and the layout).
    #[inline]
    pub(crate) fn row(&self, r: usize) -> Data<'a> {
        self.data.slice(r * self.cols, self.cols)
    }

    fn check_shape(&self, name: &'static str, rows: usize, cols: usize) -> Result<(), KdaError> {
        if self.rows == rows && self.cols == cols {
            Ok(())
        } else {
            Err(KdaError::Shape {
                arg: name,
                expected: [rows, cols],
                actual: [self.rows, self.cols],
            })
        }
    }
}

/// The weights of a gate projection, matching a [`GateProj`] form.
#[derive(Debug, Clone, Copy)]
pub enum GateWeights<'a> {
    /// One matrix `[H·K, hidden]`.
    FullRank(MatRef<'a>),
    /// `down` `[rank, hidden]`, then `up` `[H·K, rank]`.
    LowRank {
        /// First projection (`f_a_proj` / `g_a_proj`).
        down: MatRef<'a>,
        /// Second projection (`f_b_proj` / `g_b_proj`).
        up: MatRef<'a>,
    },
}

impl GateWeights<'_> {
    fn validate(
        &self,
        form: GateProj,
        names: [&'static str; 3],
        hidden: usize,
        d: usize,
    ) -> Result<(), KdaError> {
        match (form, self) {
            (GateProj::FullRank, GateWeights::FullRank(m)) => m.check_shape(names[0], d, hidden),
            (GateProj::LowRank { rank }, GateWeights::LowRank { down, up }) => {
                down.check_shape(names[1], rank, hidden)?;
                up.check_shape(names[2], d, rank)
            }
            (GateProj::FullRank, _) => Err(KdaError::Weights {
                arg: names[0],
                reason: "config says full-rank, weights are low-rank",
            }),
            (GateProj::LowRank { .. }, _) => Err(KdaError::Weights {
                arg: names[1],
                reason: "config says low-rank, weights are full-rank",
            }),
        }
    }
}

/// All weights of one KDA layer, borrowed, with their checkpoint names in the docs.
#[derive(Debug, Clone, Copy)]
pub struct KdaWeights<'a> {
    /// `q_proj.weight` `[H·K, hidden]`.
    pub q_proj: MatRef<'a>,
    /// `k_proj.weight` `[H·K, hidden]`.
    pub k_proj: MatRef<'a>,
    /// `v_proj.weight` `[H·K, hidden]`.
    pub v_proj: MatRef<'a>,
    /// `q_conv1d.weight` `[H·K, 1, W]` read as `[H·K, W]`; column `W−1` hits the current token.
    pub q_conv: Data<'a>,
    /// `k_conv1d.weight`, as `q_conv`.
    pub k_conv: Data<'a>,
    /// `v_conv1d.weight`, as `q_conv`.
    pub v_conv: Data<'a>,
    /// `A_log` `[H]` (checkpoints store `[1,1,H,1]` or a zero-padded `[128]`: pass the first H).
    /// Required by the softplus gate; optional for the lower-bound gate.
    pub a_log: Option<Data<'a>>,
    /// `dt_bias` `[H·K]`, optional.
    pub dt_bias: Option<Data<'a>>,
    /// Decay projection (`f_a_proj`/`f_b_proj`, or `f_proj`).
    pub decay_proj: GateWeights<'a>,
    /// `b_proj.weight` `[H, hidden]` (beta logits).
    pub b_proj: MatRef<'a>,
    /// Output-gate projection (`g_a_proj`/`g_b_proj`, or `g_proj`).
    pub output_gate: GateWeights<'a>,
    /// `o_norm.weight` `[K]`, shared by all heads.
    pub o_norm: Data<'a>,
    /// `o_proj.weight` `[hidden, H·K]`.
    pub o_proj: MatRef<'a>,
}

impl KdaWeights<'_> {
    /// Checks every shape and form against `cfg` (which is validated first).
    pub fn validate(&self, cfg: &KdaConfig) -> Result<(), KdaError> {
        cfg.validate()?;
        let (hd, d, h, k, w) = (
            cfg.hidden,
            cfg.proj_dim(),
            cfg.heads,
            cfg.head_dim,
            cfg.conv_width,
        );
        self.q_proj.check_shape("q_proj.weight", d, hd)?;
        self.k_proj.check_shape("k_proj.weight", d, hd)?;
        self.v_proj.check_shape("v_proj.weight", d, hd)?;
        let conv = d.checked_mul(w).ok_or(KdaError::Overflow {
            what: "conv weight",
        })?;
        self.small_params_plain()?;
        check_len("q_conv1d.weight", self.q_conv.len(), conv)?;
        check_len("k_conv1d.weight", self.k_conv.len(), conv)?;
        check_len("v_conv1d.weight", self.v_conv.len(), conv)?;
        match (cfg.decay_gate, self.a_log) {
            (_, Some(a)) => check_len("A_log", a.len(), h)?,
            (DecayGate::Softplus, None) => {
                return Err(KdaError::Weights {
                    arg: "A_log",
                    reason: "required by the softplus decay gate",
                })
            }
            (DecayGate::LowerBound(_), None) => {}
        }
        if let Some(b) = self.dt_bias {
            check_len("dt_bias", b.len(), d)?;
        }
        self.decay_proj.validate(
            cfg.decay_proj,
            ["f_proj.weight", "f_a_proj.weight", "f_b_proj.weight"],
            hd,
            d,
        )?;
        self.b_proj.check_shape("b_proj.weight", h, hd)?;
        self.output_gate.validate(
            cfg.output_gate,
            ["g_proj.weight", "g_a_proj.weight", "g_b_proj.weight"],
            hd,
            d,
        )?;
        check_len("o_norm.weight", self.o_norm.len(), k)?;
        self.o_proj.check_shape("o_proj.weight", hd, d)?;
        Ok(())
    }
}

impl KdaWeights<'_> {
    /// The convs, `A_log`, `dt_bias` and `o_norm` are f32, bf16, f16 or int8: the block and
    /// group formats are for matrices.
    fn small_params_plain(&self) -> Result<(), KdaError> {
        let small = [
            ("q_conv1d.weight", Some(self.q_conv)),
            ("k_conv1d.weight", Some(self.k_conv)),
            ("v_conv1d.weight", Some(self.v_conv)),
            ("A_log", self.a_log),
            ("dt_bias", self.dt_bias),
            ("o_norm.weight", Some(self.o_norm)),
        ];
        for (arg, d) in small {
            if d.is_some_and(|d| d.is_block_quantised()) {
                return Err(KdaError::Weights {
                    arg,
                    reason: "block- and group-quantised formats are for matrices only",
                });
            }
        }
        Ok(())
    }
}

/// Row length of a well-formed [`Data::I8`] (`None` when malformed). An empty `data` with empty
/// `scales` is well formed (row length 0).
#[inline]
pub(crate) fn i8_row_len(data_len: usize, scales_len: usize) -> Option<usize> {
    if scales_len == 0 {
        return (data_len == 0).then_some(0);
    }
    data_len
        .is_multiple_of(scales_len)
        .then_some(data_len / scales_len)
}

/// `Data::slice` for int8: whole rows keep their scales; a run inside one row keeps that row's
/// scale (and becomes a one-row view). A run across a row boundary that is not whole rows
/// cannot be expressed and comes back malformed (no caller does that).
#[inline]
pub(crate) fn slice_i8<'a>(
    data: &'a [i8],
    scales: &'a [f32],
    start: usize,
    len: usize,
) -> Data<'a> {
    let d = &data[start..start + len];
    if len == 0 {
        return Data::I8 {
            data: d,
            scales: &[],
        };
    }
    let Some(r) = i8_row_len(data.len(), scales.len()).filter(|&r| r > 0) else {
        return Data::I8 {
            data: d,
            scales: &[],
        };
    };
    let (first, last) = (start / r, (start + len - 1) / r);
    let scales = if start.is_multiple_of(r) && len.is_multiple_of(r) {
        &scales[first..=last]
    } else if first == last {
        &scales[first..first + 1]
    } else {
        debug_assert!(false, "int8 slice across a row boundary");
        &[]
    };
    Data::I8 { data: d, scales }
}
