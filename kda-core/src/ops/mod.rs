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

/// One head's rows of one sequence for the delta rule: `T = beta.len()` tokens, key dim `K`,
/// value dim `V`.
#[derive(Debug)]
pub struct HeadRows<'a> {
    /// `[T, K]` queries (L2-normalised).
    pub q: &'a [f32],
    /// `[T, K]` keys (L2-normalised).
    pub k: &'a [f32],
    /// `[T, K]` log-decays (≤ 0).
    pub g: &'a [f32],
    /// `[T]` write strengths.
    pub beta: &'a [f32],
    /// `[T, V]` values in; outputs out (or, for one [`recurrent::delta_rule_step`], the
    /// innovation `δ`).
    pub v_o: &'a mut [f32],
    /// `[K, V]` K-first state: initial in, final out.
    pub state: &'a mut [f32],
    /// The query scale.
    pub scale: f32,
}

/// The dimensions of one head's rows over `t` tokens: key dim `k`, value dim `v`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadDims {
    pub(crate) t: usize,
    pub(crate) k: usize,
    pub(crate) v: usize,
}

impl HeadRows<'_> {
    /// Checks the rows' lengths against each other (`K`, `V` ≥ 1 when `T` ≥ 1).
    pub(crate) fn dims(&self) -> Result<HeadDims, KdaError> {
        let t = self.beta.len();
        if t == 0 {
            return Ok(HeadDims { t, k: 0, v: 0 });
        }
        let kd = rows_of("q", self.q.len(), t)?.max(1);
        let vd = rows_of("v", self.v_o.len(), t)?.max(1);
        check_len("q", self.q.len(), t * kd)?;
        check_len("k", self.k.len(), self.q.len())?;
        check_len("g", self.g.len(), self.q.len())?;
        check_len("v", self.v_o.len(), t * vd)?;
        check_len("state", self.state.len(), kd * vd)?;
        Ok(HeadDims { t, k: kd, v: vd })
    }
}
