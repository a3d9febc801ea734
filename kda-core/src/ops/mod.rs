//! The layer's components, each a small function over flat slices, tested on its own.
//!
//! | file | what |
//! |---|---|
//! | [`linear()`] | `x · Wᵀ` for f32/bf16/f16/int8 weights (and the dot products) |
//! | [`conv`] | short causal depthwise conv + SiLU: prefill and single step |
//! | [`gate`] | decay gate (softplus / lower bound) and beta sigmoid |
//! | [`norm`] | q/k L2 norm and the sigmoid-gated RMSNorm |
//! | [`recurrent`] | the delta-rule step for one head |
//! | [`chunked`] | the chunked (WY/UT) form for one head of one sequence |
//!
//! Every public function checks its slice lengths and returns [`KdaError`]
//! rather than panicking.

#[allow(unsafe_code)]
pub mod chunked;
pub mod conv;
pub mod gate;
pub(crate) mod linear;
pub mod norm;

pub use linear::{dot, dot_bf16, dot_f16, dot_f32, dot_i8, linear, linear_with};
pub mod recurrent;

use crate::error::{check_len, rows_of, KdaError};

/// The dimensions of one head's rows over `t` tokens: key dim `k`, value dim `v`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadDims {
    pub(crate) t: usize,
    pub(crate) k: usize,
    pub(crate) v: usize,
}

/// Checks one head's rows for the delta rule: `q`, `k`, `g` `[T, K]`, `v` `[T, V]`, `state`
/// `[K, V]`, with `T = beta.len()` and `K`, `V` ≥ 1 when `T` ≥ 1.
pub(crate) fn head_dims(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &[f32],
) -> Result<HeadDims, KdaError> {
    let t = beta.len();
    if t == 0 {
        return Ok(HeadDims { t, k: 0, v: 0 });
    }
    let kd = rows_of("q", q.len(), t)?.max(1);
    let vd = rows_of("v", v.len(), t)?.max(1);
    check_len("q", q.len(), t * kd)?;
    check_len("k", k.len(), q.len())?;
    check_len("g", g.len(), q.len())?;
    check_len("v", v.len(), t * vd)?;
    check_len("state", state.len(), kd * vd)?;
    Ok(HeadDims { t, k: kd, v: vd })
}
