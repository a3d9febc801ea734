//! Group quantisation into compressed-tensors' `pack-quantized` form ([`quantize_groups`]):
//! what compressed-tensors (0.20.0) computes and stores for int4 / int8 groups, symmetric or
//! with zero points, when each group's scale and zero point come from its min / max
//! (`calculate_qparams`, as a static min-max observer gives them) and the weights are
//! quantised by its `PackedQuantizationCompressor.compress`. In f32, per group of `g` weights:
//!
//! - `mn = min(min x, 0)`, `mx = max(max x, 0)`; `range = 2^bits − 1`, `q ∈ [−2^(bits−1),
//!   2^(bits−1) − 1]`;
//! - symmetric: `s = max(|mn|, mx) / (range / 2)`; with zero points: `s = (mx − mn) / range`
//!   and `z = round(clamp(qmin − mn / s, qmin, qmax))` (an all-zero group gives `z = 0`);
//! - a zero scale becomes f32's epsilon (2⁻²³); the scale is then stored in its dtype (f32,
//!   bf16 or f16, rounded to nearest even) and the quants use the stored value;
//! - `q = round(clamp(x / s + z, qmin, qmax))`, rounding half to even (`torch.round`);
//! - stored `u = q + 2^(bits−1)`, packed LSB-first into 32-bit words along the row (zero points
//!   along the column), as [`super::Groups`] reads them.
//!
//! Every step is one IEEE f32 operation, so the result is bit for bit compressed-tensors' on
//! f32 weights (tested against it: kda-core/tests/quant_groups.rs). bf16 checkpoints are
//! widened to f32 first, as `w.float()` does.

use half::{bf16, f16};
use libm::{fabsf, rintf};

use super::groups::GroupFormat;
use crate::error::{check_len, KdaError};

/// Where [`quantize_groups`] writes the scales, in their stored dtype.
#[derive(Debug)]
pub enum ScalesMut<'a> {
    /// f32 scales.
    F32(&'a mut [f32]),
    /// bf16 scales.
    Bf16(&'a mut [bf16]),
    /// f16 scales.
    F16(&'a mut [f16]),
}

impl ScalesMut<'_> {
    fn len(&self) -> usize {
        match self {
            ScalesMut::F32(s) => s.len(),
            ScalesMut::Bf16(s) => s.len(),
            ScalesMut::F16(s) => s.len(),
        }
    }

    /// Stores scale `i` and returns the stored value widened to f32.
    fn put(&mut self, i: usize, v: f32) -> f32 {
        match self {
            ScalesMut::F32(s) => {
                s[i] = v;
                v
            }
            ScalesMut::Bf16(s) => {
                s[i] = bf16::from_f32(v);
                s[i].to_f32()
            }
            ScalesMut::F16(s) => {
                s[i] = f16::from_f32(v);
                s[i].to_f32()
            }
        }
    }
}

/// The tensors [`quantize_groups`] fills for a `[rows, cols]` matrix (sizes as
/// [`super::Groups::new`] checks them).
#[derive(Debug)]
pub struct GroupsOut<'a> {
    /// `weight_packed`: `rows · ⌈cols·bits/32⌉` little-endian words, as bytes.
    pub packed: &'a mut [u8],
    /// `weight_scale`: `rows · cols / group`.
    pub scales: ScalesMut<'a>,
    /// `weight_zero_point` for the asymmetric form: `⌈rows·bits/32⌉ · cols / group` words, as
    /// bytes; `None`: symmetric.
    pub zeros: Option<&'a mut [u8]>,
}

/// One group's scale (before storing) and zero point.
fn qparams(x: &[f32], format: GroupFormat, symmetric: bool) -> (f32, i32) {
    let (mut mn, mut mx) = (0.0f32, 0.0f32);
    for &v in x {
        mn = mn.min(v);
        mx = mx.max(v);
    }
    let range = ((1u32 << format.bits) - 1) as f32;
    let qmin = -(format.offset() as f32);
    let qmax = format.offset() as f32 - 1.0;
    let (s, z) = if symmetric {
        (fabsf(mn).max(mx) / (range / 2.0), 0)
    } else {
        let s = (mx - mn) / range;
        let z = (qmin - mn / s).clamp(qmin, qmax);
        // 0 / 0 for an all-zero group: NaN, which compressed-tensors stores as 0.
        (s, if z.is_nan() { 0 } else { rintf(z) as i32 })
    };
    (if s == 0.0 { f32::EPSILON } else { s }, z)
}

/// Sets the `bits` bits of element `i` (LSB-first over little-endian 32-bit words) in `b`.
fn put_bits(b: &mut [u8], i: usize, bits: usize, u: u32) {
    for k in 0..bits {
        let bit = i * bits + k;
        let byte = &mut b[bit / 8];
        *byte = (*byte & !(1 << (bit % 8))) | ((((u >> k) & 1) as u8) << (bit % 8));
    }
}

/// Quantises the `[rows, cols]` matrix `src` (row-major f32) into `out`, as compressed-tensors
/// does (see the module docs). Errors on a format [`super::Groups`] does not read, a size
/// mismatch, zero points given for the symmetric form or missing for the other, or a
/// non-finite weight.
pub fn quantize_groups(
    src: &[f32],
    (rows, cols): (usize, usize),
    format: GroupFormat,
    out: GroupsOut<'_>,
) -> Result<(), KdaError> {
    let bad = |reason| KdaError::Weights {
        arg: "quantize_groups",
        reason,
    };
    if format.bits != 4 && format.bits != 8 {
        return Err(bad("group-quantised weights must have 4 or 8 bits"));
    }
    if format.group == 0 || !cols.is_multiple_of(format.group) {
        return Err(bad("the group size does not divide the row"));
    }
    let over = KdaError::Overflow {
        what: "quantize_groups",
    };
    check_len(
        "quantize_groups src",
        src.len(),
        rows.checked_mul(cols).ok_or(over)?,
    )?;
    let words = format.row_words(cols).ok_or(over)?;
    let packed_len = rows.checked_mul(words).and_then(|n| n.checked_mul(4));
    check_len(
        "quantize_groups packed",
        out.packed.len(),
        packed_len.ok_or(over)?,
    )?;
    let groups = cols / format.group;
    check_len("quantize_groups scales", out.scales.len(), rows * groups)?;
    if let Some(z) = &out.zeros {
        let zrows = (rows * format.bits as usize).div_ceil(32);
        check_len("quantize_groups zeros", z.len(), 4 * zrows * groups)?;
    }
    if src.iter().any(|v| !v.is_finite()) {
        return Err(bad("non-finite weight cannot be quantised"));
    }
    encode(src, (rows, cols), format, out);
    Ok(())
}

fn encode(src: &[f32], (rows, cols): (usize, usize), format: GroupFormat, out: GroupsOut<'_>) {
    let GroupsOut {
        packed,
        mut scales,
        mut zeros,
    } = out;
    let (bits, g) = (format.bits as usize, format.group);
    let groups = cols / g;
    let row_bytes = 4 * format.row_words(cols).unwrap_or(0);
    let (qmin, qmax) = (-(format.offset() as f32), format.offset() as f32 - 1.0);
    packed.fill(0);
    if let Some(z) = zeros.as_deref_mut() {
        z.fill(0);
    }
    for r in 0..rows {
        let prow = &mut packed[r * row_bytes..(r + 1) * row_bytes];
        for j in 0..groups {
            let x = &src[r * cols + j * g..r * cols + (j + 1) * g];
            let (s, z) = qparams(x, format, zeros.is_none());
            let s = scales.put(r * groups + j, s);
            if let Some(zb) = zeros.as_deref_mut() {
                // Row r's zero point of group j: element r of column j, packed down the rows.
                let zrows = (rows * bits).div_ceil(32);
                let col = &mut zb[4 * j..];
                let u = (z + format.offset() as i32) as u32;
                put_zero(col, groups, zrows, r, bits, u);
            }
            for (i, &v) in x.iter().enumerate() {
                let q = rintf((v / s + z as f32).clamp(qmin, qmax)) as i32;
                put_bits(prow, j * g + i, bits, (q + format.offset() as i32) as u32);
            }
        }
    }
}

/// Sets row `r`'s zero point in a column of the `[zrows, groups]` word matrix `col` starts in
/// (word `w` of the column at byte `4·(w·groups)` of `col`).
fn put_zero(col: &mut [u8], groups: usize, zrows: usize, r: usize, bits: usize, u: u32) {
    let bit = r * bits;
    let w = bit / 32;
    debug_assert!(w < zrows);
    let at = 4 * w * groups;
    let mut word = u32::from_le_bytes([col[at], col[at + 1], col[at + 2], col[at + 3]]);
    let mask = ((1u32 << bits) - 1) << (bit % 32);
    word = (word & !mask) | (u << (bit % 32));
    col[at..at + 4].copy_from_slice(&word.to_le_bytes());
}
