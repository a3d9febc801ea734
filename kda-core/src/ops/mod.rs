//! The layer's components, each a small function over flat slices, tested on its own.
//!
//! | file | what |
//! |---|---|
//! | [`linear`] | `x · Wᵀ` for f32/bf16/f16 weights |
//! | [`conv`] | short causal depthwise conv + SiLU: prefill and single step |
//! | [`gate`] | decay gate (softplus / lower bound) and beta sigmoid |
//! | [`norm`] | q/k L2 norm and the sigmoid-gated RMSNorm |
//! | [`recurrent`] | the delta-rule step for one head |
//! | [`chunked`] | the chunked (WY/UT) form for one head of one sequence |
//!
//! Every public function checks its slice lengths and returns [`KdaError`](crate::KdaError)
//! rather than panicking.

#[allow(unsafe_code)]
pub mod chunked;
pub mod conv;
pub mod gate;
pub mod linear;
pub mod norm;
pub mod recurrent;
