//! GGUF (ggml) block formats, as llama.cpp stores them, bit for bit.
//!
//! A matrix row of `cols` weights is `cols / elems` blocks back to back; a block holds `elems`
//! weights (32, or 256 for the "K" formats) in `bytes` bytes: f16 scales and packed integer
//! quants. [`BlockFormat::dequantize_block`] is the reference: it gives the value gguf-py's
//! `gguf.quants.dequantize` gives, bit for bit (checked against fixtures made by gguf-py). Every
//! product in these formats is exact in f32 (an f16 has 11 significant bits, the integer
//! factors at most 7 + 6), so the order of the products changes no value, except the sign of a
//! zero where a scale is signed (Q3_K, Q6_K): the sub-block scale is multiplied into `d` first,
//! as gguf-py does.

use half::f16;

use crate::error::KdaError;

/// One GGUF block format (the names are ggml's).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum BlockFormat {
    /// 32 weights: f16 `d`, 4-bit quants; `w = d·(q − 8)`.
    Q4_0,
    /// 32 weights: f16 `d`, f16 `m`, 4-bit quants; `w = d·q + m`.
    Q4_1,
    /// 32 weights: f16 `d`, 5-bit quants; `w = d·(q − 16)`.
    Q5_0,
    /// 32 weights: f16 `d`, f16 `m`, 5-bit quants; `w = d·q + m`.
    Q5_1,
    /// 32 weights: f16 `d`, int8 quants; `w = d·q`.
    Q8_0,
    /// 256 weights: 16 sub-blocks of 16 with 4-bit scales and mins, 2-bit quants.
    Q2_K,
    /// 256 weights: 16 sub-blocks of 16 with signed 6-bit scales, 3-bit quants.
    Q3_K,
    /// 256 weights: 8 sub-blocks of 32 with 6-bit scales and mins, 4-bit quants.
    Q4_K,
    /// 256 weights: 8 sub-blocks of 32 with 6-bit scales and mins, 5-bit quants.
    Q5_K,
    /// 256 weights: 16 sub-blocks of 16 with int8 scales, 6-bit quants.
    Q6_K,
}

impl BlockFormat {
    /// Every format, in ggml's type-id order.
    pub const ALL: [BlockFormat; 10] = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q8_0,
        BlockFormat::Q2_K,
        BlockFormat::Q3_K,
        BlockFormat::Q4_K,
        BlockFormat::Q5_K,
        BlockFormat::Q6_K,
    ];

    /// ggml's name of the format (`"Q4_K"`).
    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Q4_0 => "Q4_0",
            BlockFormat::Q4_1 => "Q4_1",
            BlockFormat::Q5_0 => "Q5_0",
            BlockFormat::Q5_1 => "Q5_1",
            BlockFormat::Q8_0 => "Q8_0",
            BlockFormat::Q2_K => "Q2_K",
            BlockFormat::Q3_K => "Q3_K",
            BlockFormat::Q4_K => "Q4_K",
            BlockFormat::Q5_K => "Q5_K",
            BlockFormat::Q6_K => "Q6_K",
        }
    }

    /// ggml's type id (`ggml_type`), as stored in GGUF tensor infos.
    pub fn ggml_type(self) -> u32 {
        match self {
            BlockFormat::Q4_0 => 2,
            BlockFormat::Q4_1 => 3,
            BlockFormat::Q5_0 => 6,
            BlockFormat::Q5_1 => 7,
            BlockFormat::Q8_0 => 8,
            BlockFormat::Q2_K => 10,
            BlockFormat::Q3_K => 11,
            BlockFormat::Q4_K => 12,
            BlockFormat::Q5_K => 13,
            BlockFormat::Q6_K => 14,
        }
    }

    /// The format with ggml type id `id`, if it is one of these.
    pub fn from_ggml_type(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.ggml_type() == id)
    }

    /// Weights per block.
    pub fn block_elems(self) -> usize {
        match self {
            BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1
            | BlockFormat::Q8_0 => 32,
            _ => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q5_1 => 24,
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q2_K => 84,
            BlockFormat::Q3_K => 110,
            BlockFormat::Q4_K => 144,
            BlockFormat::Q5_K => 176,
            BlockFormat::Q6_K => 210,
        }
    }

    /// Bits stored per weight, scales included (Q4_K: 4.5).
    pub fn bits_per_weight(self) -> f32 {
        (8 * self.block_bytes()) as f32 / self.block_elems() as f32
    }

    /// Bytes of `elems` weights (a whole number of blocks), or `None` if `elems` is not a
    /// multiple of [`BlockFormat::block_elems`] or the size overflows.
    pub fn bytes_for(self, elems: usize) -> Option<usize> {
        if !elems.is_multiple_of(self.block_elems()) {
            return None;
        }
        (elems / self.block_elems()).checked_mul(self.block_bytes())
    }

    /// Dequantises one block: `src` is [`BlockFormat::block_bytes`] long, `out`
    /// [`BlockFormat::block_elems`] long.
    pub fn dequantize_block(self, src: &[u8], out: &mut [f32]) -> Result<(), KdaError> {
        crate::error::check_len("dequantize_block src", src.len(), self.block_bytes())?;
        crate::error::check_len("dequantize_block out", out.len(), self.block_elems())?;
        self.dequantize_unchecked(src, out);
        Ok(())
    }

    /// Dequantises whole blocks: `src` holds `out.len() / block_elems` blocks.
    pub fn dequantize_row(self, src: &[u8], out: &mut [f32]) -> Result<(), KdaError> {
        let need = self.bytes_for(out.len()).ok_or(KdaError::Length {
            arg: "dequantize_row out",
            expected: out.len().next_multiple_of(self.block_elems()),
            actual: out.len(),
        })?;
        crate::error::check_len("dequantize_row src", src.len(), need)?;
        let blocks = src.chunks_exact(self.block_bytes());
        for (b, o) in blocks.zip(out.chunks_exact_mut(self.block_elems())) {
            self.dequantize_unchecked(b, o);
        }
        Ok(())
    }

    /// [`BlockFormat::dequantize_block`] without the length checks (the caller guarantees
    /// them; a short slice panics on its bounds check, never reads out of bounds).
    #[inline]
    pub(crate) fn dequantize_unchecked(self, b: &[u8], y: &mut [f32]) {
        debug_assert!(b.len() == self.block_bytes() && y.len() == self.block_elems());
        match self {
            BlockFormat::Q4_0 => q4_0(b, y),
            BlockFormat::Q4_1 => q4_1(b, y),
            BlockFormat::Q5_0 => q5_0(b, y),
            BlockFormat::Q5_1 => q5_1(b, y),
            BlockFormat::Q8_0 => q8_0(b, y),
            BlockFormat::Q2_K => q2_k(b, y),
            BlockFormat::Q3_K => q3_k(b, y),
            BlockFormat::Q4_K => q4_k(b, y),
            BlockFormat::Q5_K => q5_k(b, y),
            BlockFormat::Q6_K => q6_k(b, y),
        }
    }
}

/// The little-endian f16 at `b[at..at + 2]`, widened exactly to f32.
#[inline(always)]
pub(crate) fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The little-endian u32 at `b[at..at + 4]`.
#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * ((q & 0xF) as i32 - 8) as f32;
        y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

fn q4_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        y[j] = d * (q & 0xF) as f32 + m;
        y[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The 32 five-bit quants of a Q5_0 / Q5_1 block: low nibbles `qs`, fifth bits `qh`.
fn q5_quants(qh: u32, qs: &[u8]) -> [i32; 32] {
    let mut q = [0i32; 32];
    for (j, &v) in qs.iter().enumerate() {
        q[j] = ((v & 0xF) as u32 | ((qh >> j) & 1) << 4) as i32;
        q[j + 16] = ((v >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i32;
    }
    q
}

fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, q) in y.iter_mut().zip(q5_quants(u32_at(b, 2), &b[6..22])) {
        *o = d * (q - 16) as f32;
    }
}

fn q5_1(b: &[u8], y: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    for (o, q) in y.iter_mut().zip(q5_quants(u32_at(b, 4), &b[8..24])) {
        *o = d * q as f32 + m;
    }
}

fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// Q2_K: `scales[16]` (low nibble scale, high nibble min), `qs[64]`, f16 `d`, f16 `dmin`.
/// Output `128n + 32j + 16h + l` is bit pair `j` of `qs[32n + 16h + l]`, sub-block
/// `8n + 2j + h`.
fn q2_k(b: &[u8], y: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half_at(b, 80), half_at(b, 82));
    for n in 0..2 {
        for j in 0..4 {
            for h in 0..2 {
                let s = 8 * n + 2 * j + h;
                let dl = d * (scales[s] & 0xF) as f32;
                let ml = dmin * (scales[s] >> 4) as f32;
                for l in 0..16 {
                    let q = (qs[32 * n + 16 * h + l] >> (2 * j)) & 3;
                    y[16 * s + l] = dl * q as f32 - ml;
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of a Q3_K block from its 12 scale bytes.
fn q3_scales(s: &[u8]) -> [i32; 16] {
    let mut sc = [0i32; 16];
    for (i, v) in sc.iter_mut().enumerate() {
        let lo = (s[i % 8] >> (4 * (i / 8))) & 0xF;
        let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *v = (lo | hi << 4) as i32 - 32;
    }
    sc
}

/// Q3_K: `hmask[32]`, `qs[64]`, `scales[12]`, f16 `d`; the traversal of Q2_K, with the third
/// bit of output `(n, j, h, l)` in bit `4n + j` of `hmask[16h + l]` (clear: −4).
fn q3_k(b: &[u8], y: &mut [f32]) {
    let (hmask, qs, sc) = (&b[0..32], &b[32..96], q3_scales(&b[96..108]));
    let d = half_at(b, 108);
    for n in 0..2 {
        for j in 0..4 {
            for h in 0..2 {
                let s = 8 * n + 2 * j + h;
                let dl = d * sc[s] as f32;
                for l in 0..16 {
                    let low = ((qs[32 * n + 16 * h + l] >> (2 * j)) & 3) as i32;
                    let high = (hmask[16 * h + l] >> (4 * n + j)) & 1;
                    let q = low - if high != 0 { 0 } else { 4 };
                    y[16 * s + l] = dl * q as f32;
                }
            }
        }
    }
}

/// Scale and min `j` (6 bits each) of a Q4_K / Q5_K block's 12 scale bytes.
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Q4_K: f16 `d`, f16 `dmin`, `scales[12]`, `qs[128]`. Outputs `64c..64c + 32` are the low
/// nibbles of `qs[32c..32c + 32]` (sub-block `2c`), the next 32 their high nibbles.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin, scales, qs) = (half_at(b, 0), half_at(b, 2), &b[4..16], &b[16..144]);
    for c in 0..4 {
        for h in 0..2 {
            let (sc, m) = scale_min_k4(2 * c + h, scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            for l in 0..32 {
                let q = (qs[32 * c + l] >> (4 * h)) & 0xF;
                y[64 * c + 32 * h + l] = dl * q as f32 - ml;
            }
        }
    }
}

/// Q5_K: Q4_K's layout plus `qh[32]` (after the scales) holding the fifth bit of output
/// `(c, h, l)` in bit `2c + h` of `qh[l]`.
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin, scales) = (half_at(b, 0), half_at(b, 2), &b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for c in 0..4 {
        for h in 0..2 {
            let (sc, m) = scale_min_k4(2 * c + h, scales);
            let (dl, ml) = (d * sc as f32, dmin * m as f32);
            for l in 0..32 {
                let low = (qs[32 * c + l] >> (4 * h)) & 0xF;
                let high = (qh[l] >> (2 * c + h)) & 1;
                y[64 * c + 32 * h + l] = dl * (low | high << 4) as f32 - ml;
            }
        }
    }
}

/// Q6_K: `ql[128]`, `qh[64]`, int8 `scales[16]`, f16 `d`. In half `n`, output
/// `128n + 32k + l` takes its low 4 bits from `ql[64n + 32(k % 2) + l]` (low nibble for
/// k < 2, high for k ≥ 2) and its high 2 bits from bits `2k..2k + 2` of `qh[32n + l]`; scale
/// `scales[8n + 2k + l / 16]`.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half_at(b, 208);
    for n in 0..2 {
        for k in 0..4 {
            for l in 0..32 {
                let low = (ql[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
                let high = (qh[32 * n + l] >> (2 * k)) & 3;
                let q = (low | high << 4) as i32 - 32;
                let sc = scales[8 * n + 2 * k + l / 16] as i8;
                y[128 * n + 32 * k + l] = (d * sc as f32) * q as f32;
            }
        }
    }
}

/// A borrowed run of block-quantised weights: `len` weights (a whole number of blocks) in
/// `len / elems · bytes` bytes.
#[derive(Debug, Clone, Copy)]
pub struct Blocks<'a> {
    format: BlockFormat,
    bytes: &'a [u8],
    len: usize,
}

impl<'a> Blocks<'a> {
    /// Views `bytes` as `len` weights in `format`; errors (naming `arg`) unless `len` is a
    /// whole number of blocks and `bytes` exactly their size.
    pub fn new(
        arg: &'static str,
        format: BlockFormat,
        bytes: &'a [u8],
        len: usize,
    ) -> Result<Self, KdaError> {
        let need = format.bytes_for(len).ok_or(KdaError::Weights {
            arg,
            reason: "the weight count is not a whole number of quantisation blocks",
        })?;
        crate::error::check_len(arg, bytes.len(), need)?;
        Ok(Blocks { format, bytes, len })
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// The stored bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Number of weights.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no weights.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Weight `i` (dequantises its block), or `None` past the end.
    pub fn get(&self, i: usize) -> Option<f32> {
        if i >= self.len {
            return None;
        }
        let (e, n) = (self.format.block_elems(), self.format.block_bytes());
        let mut out = [0.0f32; 256];
        let block = &self.bytes[(i / e) * n..(i / e + 1) * n];
        self.format.dequantize_unchecked(block, &mut out[..e]);
        Some(out[i % e])
    }

    /// Weights `start..start + len`, if both are whole blocks and in range.
    pub fn slice(&self, start: usize, len: usize) -> Option<Blocks<'a>> {
        let (e, n) = (self.format.block_elems(), self.format.block_bytes());
        let end = start.checked_add(len)?;
        if end > self.len || !start.is_multiple_of(e) || !len.is_multiple_of(e) {
            return None;
        }
        Some(Blocks {
            format: self.format,
            bytes: &self.bytes[start / e * n..end / e * n],
            len,
        })
    }

    /// The blocks' bytes, one block at a time, in order.
    pub fn blocks(&self) -> core::slice::ChunksExact<'a, u8> {
        self.bytes.chunks_exact(self.format.block_bytes())
    }
}
