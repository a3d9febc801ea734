//! What the C-API tests share.
#![allow(dead_code)]

use kda_capi::*;

/// An f32 row-major tensor descriptor over `v`.
pub fn f32_tensor(v: &[f32]) -> KdaTensor {
    KdaTensor {
        data: v.as_ptr().cast(),
        len: v.len(),
        dtype: KDA_DTYPE_F32,
        layout: KDA_LAYOUT_ROWS,
        scales: std::ptr::null(),
        scales_len: 0,
    }
}
