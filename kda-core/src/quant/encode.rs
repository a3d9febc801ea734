//! Encoders: f32 weights into GGUF blocks, bit for bit what ggml's reference quantisers write.
//!
//! [`BlockFormat::quantize_row`] gives the bytes of ggml's `quantize_row_<fmt>_ref`
//! (ggml-quants.c, llama.cpp 0c1e570 as vendored in the llama-cpp-python 0.3.36 sdist), which
//! is what `llama-quantize` writes for these formats without an importance matrix; checked bit
//! for bit against that code compiled for x86-64 (tests/fixtures/quant, kda-core/tests/
//! quant_encode.rs), and for Q4_0 … Q8_0 against gguf-py's `gguf.quants.quantize` too.
//!
//! Bit for bit means every float operation in the same order with the same rounding: ggml's
//! helpers are ported as they are (`nearest_int`'s magic-number rounding, its f32 → f16
//! conversion, `make_qx_quants`, `make_q3_quants`, `make_qkx2_quants` with their sums in f32,
//! left to right, no fused multiply-add: ggml-base, which holds ggml-quants.c, is built
//! without `-march` flags, so x86-64 builds of llama.cpp do not fuse them either; a build that
//! does, GCC for AArch64 for one, can write other bytes). Where C converts an out-of-range
//! float to an integer (undefined behaviour; only for blocks of f32 subnormals, whose
//! reciprocal scale overflows), the x86-64 result is reproduced: `cvttss2si` gives
//! `0x8000_0000`, of which the low byte is kept.
//!
//! Non-finite weights are refused (ggml would write garbage for them). Everything works over
//! caller slices with small fixed arrays on the stack: no allocation.

use libm::{fabsf, roundf};

use super::blocks::BlockFormat;
use super::encode_k;
use super::ggml_float::{c_trunc, put_half};
use crate::error::{check_len, KdaError};

impl BlockFormat {
    /// Quantises `src` (a whole number of blocks) into `out`
    /// ([`BlockFormat::bytes_for`]`(src.len())` bytes), as ggml's reference quantiser does.
    /// Errors on a length that is not whole blocks, an `out` of another size, or a non-finite
    /// weight.
    pub fn quantize_row(self, src: &[f32], out: &mut [u8]) -> Result<(), KdaError> {
        let need = self.bytes_for(src.len()).ok_or(KdaError::Length {
            arg: "quantize_row src",
            expected: src.len().next_multiple_of(self.block_elems()),
            actual: src.len(),
        })?;
        check_len("quantize_row out", out.len(), need)?;
        if src.iter().any(|v| !v.is_finite()) {
            return Err(KdaError::Weights {
                arg: "quantize_row src",
                reason: "non-finite weight cannot be quantised",
            });
        }
        let blocks = src.chunks_exact(self.block_elems());
        for (x, b) in blocks.zip(out.chunks_exact_mut(self.block_bytes())) {
            self.quantize_unchecked(x, b);
        }
        Ok(())
    }

    /// One block, lengths already checked.
    fn quantize_unchecked(self, x: &[f32], b: &mut [u8]) {
        match self {
            BlockFormat::Q4_0 => q4_0(x, b),
            BlockFormat::Q4_1 => q4_1(x, b),
            BlockFormat::Q5_0 => q5_0(x, b),
            BlockFormat::Q5_1 => q5_1(x, b),
            BlockFormat::Q8_0 => q8_0(x, b),
            BlockFormat::Q2_K => encode_k::q2_k(x, b),
            BlockFormat::Q3_K => encode_k::q3_k(x, b),
            BlockFormat::Q4_K => encode_k::q4_k(x, b),
            BlockFormat::Q5_K => encode_k::q5_k(x, b),
            BlockFormat::Q6_K => encode_k::q6_k(x, b),
        }
    }
}

/// C's `MIN(k, (int8_t)v)` as the `uint8_t` it is stored in.
#[inline(always)]
fn min_i8(k: i32, v: f32) -> u8 {
    let t = c_trunc(v) as i8 as i32;
    (if k < t { k } else { t }) as u8
}

/// The first value of largest magnitude (0 when all are zero), as ggml's loops find it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < fabsf(v) {
            amax = fabsf(v);
            max = v;
        }
    }
    max
}

/// Smallest and largest value, as ggml's Q4_1 / Q5_1 loops find them.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

fn q4_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -8.0;
    let id = inverse(d);
    put_half(b, 0, d);
    for j in 0..16 {
        let lo = min_i8(15, x[j] * id + 8.5);
        let hi = min_i8(15, x[j + 16] * id + 8.5);
        b[2 + j] = lo | hi << 4;
    }
}

fn q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse(d);
    put_half(b, 0, d);
    put_half(b, 2, min);
    for j in 0..16 {
        let lo = min_i8(15, (x[j] - min) * id + 0.5);
        let hi = min_i8(15, (x[j + 16] - min) * id + 0.5);
        b[4 + j] = lo | hi << 4;
    }
}

/// The low nibbles of 32 five-bit quants into `qs` (16 bytes), their fifth bits as a word.
fn pack_q5(q: &[u8; 32], qs: &mut [u8]) -> u32 {
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4;
        qh |= ((q[j] as u32 & 0x10) >> 4) << j;
        qh |= ((q[j + 16] as u32 & 0x10) >> 4) << (j + 16);
    }
    qh
}

fn q5_0(x: &[f32], b: &mut [u8]) {
    let d = signed_absmax(x) / -16.0;
    let id = inverse(d);
    put_half(b, 0, d);
    let mut q = [0u8; 32];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = min_i8(31, v * id + 16.5);
    }
    let qh = pack_q5(&q, &mut b[6..22]);
    b[2..6].copy_from_slice(&qh.to_le_bytes());
}

fn q5_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse(d);
    put_half(b, 0, d);
    put_half(b, 2, min);
    let mut q = [0u8; 32];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = c_trunc((v - min) * id + 0.5) as u8;
    }
    let qh = pack_q5(&q, &mut b[8..24]);
    b[4..8].copy_from_slice(&qh.to_le_bytes());
}

fn q8_0(x: &[f32], b: &mut [u8]) {
    let mut amax = 0.0f32;
    for &v in x {
        let a = fabsf(v);
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = inverse(d);
    put_half(b, 0, d);
    for (o, &v) in b[2..34].iter_mut().zip(x) {
        *o = c_trunc(roundf(v * id)) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_lengths_and_non_finite() {
        let mut out = [0u8; 34];
        let f = BlockFormat::Q8_0;
        assert!(f.quantize_row(&[0.0; 31], &mut out).is_err());
        assert!(f.quantize_row(&[0.0; 32], &mut out[..33]).is_err());
        let mut x = [0.0f32; 32];
        x[3] = f32::NAN;
        assert!(f.quantize_row(&x, &mut out).is_err());
        x[3] = f32::NEG_INFINITY;
        assert!(f.quantize_row(&x, &mut out).is_err());
        x[3] = 1.0;
        assert!(f.quantize_row(&x, &mut out).is_ok());
    }
}
