//! Group-wise int4 / int8 weights as compressed-tensors' `pack-quantized` format stores them.
//!
//! A `[rows, cols]` matrix is stored as:
//! - `weight_packed`: per row, the `cols` quants packed LSB-first into little-endian 32-bit
//!   words (8 per word at 4 bits, 4 at 8 bits; the row padded to whole words), each quant
//!   stored as `u = q + 2^(bits−1)`;
//! - `weight_scale`: `[rows, cols / group]` scales (f32, bf16 or f16); a per-channel scale is
//!   the case `group = cols`;
//! - `weight_zero_point` (asymmetric form only): `[⌈rows·bits/32⌉, cols / group]` words, the
//!   zero points packed the same way but along the **rows**, stored with the same offset.
//!
//! The weight is `w = (u − z_u) · scale` with `z_u = 2^(bits−1)` in the symmetric form,
//! computed in f32, where it is exact (`|u − z_u| ≤ 255` times a bf16 or f16 scale has at most
//! 8 + 11 significant bits). compressed-tensors' own `decompress()` returns that product
//! rounded to the scale's dtype (bf16 for the Kimi checkpoints); the products here use the
//! exact value, as llama.cpp's converter does, which differs from the bf16-rounded one by at
//! most half a bf16 ulp (2⁻⁹ relative).

use half::{bf16, f16};

use crate::error::{check_len, KdaError};

/// Bits and group size of a [`Groups`] matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct GroupFormat {
    /// Bits per quant: 4 or 8.
    pub bits: u8,
    /// Weights per scale along a row (32, 64, 128, …, or the whole row).
    pub group: usize,
}

impl GroupFormat {
    /// 32-bit words per packed row of `cols` quants.
    pub fn row_words(self, cols: usize) -> Option<usize> {
        Some(cols.checked_mul(self.bits as usize)?.div_ceil(32))
    }

    /// The offset stored quants (and zero points) carry, `2^(bits−1)`.
    pub fn offset(self) -> u32 {
        1 << (self.bits - 1)
    }

    fn mask(self) -> u32 {
        (1u32 << self.bits) - 1
    }
}

/// The scales of a [`Groups`] matrix, in their stored dtype.
#[derive(Debug, Clone, Copy)]
pub enum Scales<'a> {
    /// f32 scales.
    F32(&'a [f32]),
    /// bf16 scales (the Kimi checkpoints').
    Bf16(&'a [bf16]),
    /// f16 scales.
    F16(&'a [f16]),
}

impl Scales<'_> {
    /// Number of scales.
    pub fn len(&self) -> usize {
        match self {
            Scales::F32(s) => s.len(),
            Scales::Bf16(s) => s.len(),
            Scales::F16(s) => s.len(),
        }
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Scale `i` widened to f32 (caller keeps `i` in range).
    #[inline(always)]
    pub(crate) fn at(&self, i: usize) -> f32 {
        match self {
            Scales::F32(s) => s[i],
            Scales::Bf16(s) => s[i].to_f32(),
            Scales::F16(s) => s[i].to_f32(),
        }
    }
}

/// A borrowed `pack-quantized` matrix `[rows, cols]`: its stored tensors, checked. Weight
/// views hold it by reference ([`GroupRows`]), so [`crate::Data`] stays small.
#[derive(Debug, Clone, Copy)]
pub struct Groups<'a> {
    format: GroupFormat,
    packed: &'a [u8],
    scales: Scales<'a>,
    zeros: Option<&'a [u8]>,
    rows: usize,
    cols: usize,
}

/// The stored tensors of one `pack-quantized` matrix `[rows, cols]`.
#[derive(Debug, Clone, Copy)]
pub struct GroupTensors<'a> {
    /// `weight_packed`, as bytes (little-endian 32-bit words).
    pub packed: &'a [u8],
    /// `weight_scale`.
    pub scales: Scales<'a>,
    /// `weight_zero_point`, as bytes, for the asymmetric form.
    pub zeros: Option<&'a [u8]>,
}

impl<'a> Groups<'a> {
    /// Views the tensors of a `[rows, cols]` matrix; errors (naming `arg`) on unsupported bits,
    /// a group that does not divide the row, or a tensor of the wrong size.
    pub fn new(
        arg: &'static str,
        format: GroupFormat,
        t: GroupTensors<'a>,
        rows: usize,
        cols: usize,
    ) -> Result<Self, KdaError> {
        let bad = |reason| KdaError::Weights { arg, reason };
        if format.bits != 4 && format.bits != 8 {
            return Err(bad("group-quantised weights must have 4 or 8 bits"));
        }
        if format.group == 0 || !cols.is_multiple_of(format.group) {
            return Err(bad("the group size does not divide the row"));
        }
        let over = KdaError::Overflow { what: arg };
        let words = format.row_words(cols).ok_or(over)?;
        let packed = rows.checked_mul(words).and_then(|n| n.checked_mul(4));
        check_len(arg, t.packed.len(), packed.ok_or(over)?)?;
        let groups = cols / format.group;
        check_len(arg, t.scales.len(), rows.checked_mul(groups).ok_or(over)?)?;
        if let Some(z) = t.zeros {
            let zrows = rows
                .checked_mul(format.bits as usize)
                .ok_or(over)?
                .div_ceil(32);
            let need = zrows.checked_mul(groups).and_then(|n| n.checked_mul(4));
            check_len(arg, z.len(), need.ok_or(over)?)?;
        }
        Ok(Groups {
            format,
            packed: t.packed,
            scales: t.scales,
            zeros: t.zeros,
            rows,
            cols,
        })
    }

    /// Bits and group size.
    pub fn format(&self) -> GroupFormat {
        self.format
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Weights per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `weight_packed`, as stored.
    pub fn packed(&self) -> &'a [u8] {
        self.packed
    }

    /// `weight_zero_point`, as stored (the asymmetric form).
    pub fn zeros(&self) -> Option<&'a [u8]> {
        self.zeros
    }

    /// The scales, as stored.
    pub fn scales(&self) -> Scales<'a> {
        self.scales
    }

    /// Whether zero points are stored (the asymmetric form).
    pub fn has_zeros(&self) -> bool {
        self.zeros.is_some()
    }

    /// Bytes of the stored tensors (packed quants, scales, zero points).
    pub fn stored_bytes(&self) -> usize {
        let scale = match self.scales {
            Scales::F32(_) => 4,
            _ => 2,
        };
        self.packed.len() + scale * self.scales.len() + self.zeros.map_or(0, <[u8]>::len)
    }

    /// Every row, as a weight view.
    pub fn all_rows(&'a self) -> GroupRows<'a> {
        GroupRows {
            m: self,
            row0: 0,
            rows: self.rows,
        }
    }

    fn row_bytes(&self) -> usize {
        4 * self.format.row_words(self.cols).unwrap_or(0)
    }

    /// The stored quant `u` of row `r`, column `c` (caller keeps them in range).
    #[inline(always)]
    pub(crate) fn quant(&self, r: usize, c: usize) -> u32 {
        let bit = c * self.format.bits as usize;
        let byte = r * self.row_bytes() + bit / 8;
        (self.packed[byte] as u32 >> (bit % 8)) & self.format.mask()
    }

    /// The stored zero point of row `r`, group `g`.
    #[inline(always)]
    pub(crate) fn zero(&self, r: usize, g: usize) -> u32 {
        let Some(z) = self.zeros else {
            return self.format.offset();
        };
        let bit = r * self.format.bits as usize;
        let groups = self.cols / self.format.group;
        let at = 4 * ((bit / 32) * groups + g);
        let w = u32::from_le_bytes([z[at], z[at + 1], z[at + 2], z[at + 3]]);
        (w >> (bit % 32)) & self.format.mask()
    }

    /// The scale of row `r`, group `g`.
    #[inline(always)]
    pub(crate) fn scale(&self, r: usize, g: usize) -> f32 {
        self.scales.at(r * (self.cols / self.format.group) + g)
    }

    /// Weight `(r, c)`, dequantised (caller keeps them in range).
    #[inline]
    pub(crate) fn weight(&self, r: usize, c: usize) -> f32 {
        let g = c / self.format.group;
        let q = self.quant(r, c) as i32 - self.zero(r, g) as i32;
        q as f32 * self.scale(r, g)
    }

    /// Dequantises row `r` into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) -> Result<(), KdaError> {
        check_len("dequantize_row out", out.len(), self.cols)?;
        if r >= self.rows {
            return Err(KdaError::Length {
                arg: "dequantize_row row",
                expected: self.rows,
                actual: r,
            });
        }
        for (c, o) in out.iter_mut().enumerate() {
            *o = self.weight(r, c);
        }
        Ok(())
    }
}

/// Rows `row0..row0 + rows` of a [`Groups`] matrix: the weight view [`crate::Data::Groups`]
/// holds.
#[derive(Debug, Clone, Copy)]
pub struct GroupRows<'a> {
    m: &'a Groups<'a>,
    row0: usize,
    rows: usize,
}

impl<'a> GroupRows<'a> {
    /// The whole matrix.
    pub fn matrix(&self) -> &'a Groups<'a> {
        self.m
    }

    /// First row of the view within the matrix.
    pub fn first_row(&self) -> usize {
        self.row0
    }

    /// Rows of the view.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Weights per row.
    pub fn cols(&self) -> usize {
        self.m.cols
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.rows * self.m.cols
    }

    /// True when there are no weights.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Weight `(r, c)` of the view (caller keeps them in range).
    #[inline]
    pub(crate) fn weight(&self, r: usize, c: usize) -> f32 {
        self.m.weight(self.row0 + r, c)
    }

    /// Weight `i` (row-major), or `None` past the end.
    pub fn get(&self, i: usize) -> Option<f32> {
        let cols = self.m.cols;
        (i < self.len()).then(|| self.weight(i / cols, i % cols))
    }

    /// Weights `start..start + len` (row-major), if they are whole rows in range.
    pub fn slice(&self, start: usize, len: usize) -> Option<GroupRows<'a>> {
        let cols = self.m.cols.max(1);
        let end = start.checked_add(len)?;
        if end > self.len() || !start.is_multiple_of(cols) || !len.is_multiple_of(cols) {
            return None;
        }
        Some(GroupRows {
            m: self.m,
            row0: self.row0 + start / cols,
            rows: len / cols,
        })
    }
}
