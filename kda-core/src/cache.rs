//! Per-sequence caches: the recurrent state and the three conv states, and layout conversions.
//!
//! For `N` sequences the caller provides four flat f32 slices:
//!
//! | slice | shape | layout |
//! |---|---|---|
//! | `recurrent` | `[N, H, K, V]` | **K-first** (Kimi Linear HF): `((n·H + h)·K + d)·V + e` |
//! | `conv_q`, `conv_k`, `conv_v` | `[N, H·K, W−1]` | channel-major, each channel's last `W−1` raw projected inputs oldest first |
//!
//! fla's layer and vLLM keep the recurrent state **V-first** `[N, H, V, K]`; convert with
//! [`k_first_to_v_first`] / [`v_first_to_k_first`] (exact: a transpose).

use crate::config::KdaConfig;
use crate::error::{check_len, mul, rows_of, KdaError};

/// Mutable views of the caches of `N` sequences (see the module docs for the layouts).
#[derive(Debug)]
pub struct CachesMut<'a> {
    /// Recurrent states `[N, H, K, V]`, K-first.
    pub recurrent: &'a mut [f32],
    /// q conv states `[N, H·K, W−1]`.
    pub conv_q: &'a mut [f32],
    /// k conv states `[N, H·K, W−1]`.
    pub conv_k: &'a mut [f32],
    /// v conv states `[N, H·K, W−1]`.
    pub conv_v: &'a mut [f32],
}

impl<'a> CachesMut<'a> {
    /// Checks that the slices hold exactly `n` sequences' caches for `cfg`.
    pub fn validate(&self, cfg: &KdaConfig, n: usize) -> Result<(), KdaError> {
        let lens = [self.conv_q.len(), self.conv_k.len(), self.conv_v.len()];
        check_cache_lens(cfg, n, self.recurrent.len(), lens)
    }

    /// Zeroes every cache (a fresh sequence has zero state and zero conv history).
    pub fn reset(&mut self) {
        self.recurrent.fill(0.0);
        self.conv_q.fill(0.0);
        self.conv_k.fill(0.0);
        self.conv_v.fill(0.0);
    }

    /// Zeroes the caches of sequence `n` only (no-op past the end).
    pub fn reset_sequence(&mut self, cfg: &KdaConfig, n: usize) {
        let (Ok(s), Ok(c)) = (cfg.state_len(), cfg.conv_state_len()) else {
            return;
        };
        for (buf, len) in [
            (&mut *self.recurrent, s),
            (&mut *self.conv_q, c),
            (&mut *self.conv_k, c),
            (&mut *self.conv_v, c),
        ] {
            if let Some(part) = n.checked_mul(len).and_then(|a| buf.get_mut(a..a + len)) {
                part.fill(0.0);
            }
        }
    }

    /// A shorter-lived reborrow, so the same caches can be passed to several calls.
    pub fn reborrow(&mut self) -> CachesMut<'_> {
        CachesMut {
            recurrent: self.recurrent,
            conv_q: self.conv_q,
            conv_k: self.conv_k,
            conv_v: self.conv_v,
        }
    }
}

/// Checks the lengths of `n` sequences' caches (recurrent state and q/k/v conv states, in any
/// element type) against `cfg`, naming the slice that is wrong.
pub(crate) fn check_cache_lens(
    cfg: &KdaConfig,
    n: usize,
    recurrent: usize,
    conv: [usize; 3],
) -> Result<(), KdaError> {
    check_len(
        "recurrent state",
        recurrent,
        mul("recurrent state", n, cfg.state_len()?)?,
    )?;
    let want = mul("conv state", n, cfg.conv_state_len()?)?;
    check_len("conv_state_q", conv[0], want)?;
    check_len("conv_state_k", conv[1], want)?;
    check_len("conv_state_v", conv[2], want)
}

fn transpose_blocks(
    src: &[f32],
    dst: &mut [f32],
    rows: usize,
    cols: usize,
) -> Result<(), KdaError> {
    let block = mul("state", rows, cols)?;
    check_len("state dst", dst.len(), src.len())?;
    if block == 0 && !src.is_empty() {
        return Err(KdaError::Length {
            arg: "state src",
            expected: 0,
            actual: src.len(),
        });
    }
    rows_of("state src", src.len(), block)?;
    for (s, d) in src.chunks_exact(block).zip(dst.chunks_exact_mut(block)) {
        for r in 0..rows {
            for c in 0..cols {
                d[c * rows + r] = s[r * cols + c];
            }
        }
    }
    Ok(())
}

/// K-first `[.., K, V]` → V-first `[.., V, K]` for any number of `[K, V]` blocks.
pub fn k_first_to_v_first(
    src: &[f32],
    dst: &mut [f32],
    k: usize,
    v: usize,
) -> Result<(), KdaError> {
    transpose_blocks(src, dst, k, v)
}

/// V-first `[.., V, K]` → K-first `[.., K, V]` for any number of `[V, K]` blocks.
pub fn v_first_to_k_first(
    src: &[f32],
    dst: &mut [f32],
    k: usize,
    v: usize,
) -> Result<(), KdaError> {
    transpose_blocks(src, dst, v, k)
}
