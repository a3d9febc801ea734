//! # kda-core
//!
//! Kimi Delta Attention — the gated delta-rule linear attention of Kimi Linear and Kimi K3 —
//! as a `no_std`, allocation-free layer over caller-provided slices.
//!
//! * [`KdaConfig`] fixes the shapes and gate forms; [`KdaWeights`] borrows the checkpoint's
//!   tensors (f32, bf16 or f16, `[out, in]` row-major).
//! * The caller owns every buffer and asks the core how big each must be:
//!   [`KdaConfig::state_len`], [`KdaConfig::conv_state_len`], [`KdaLayer::workspace_len`],
//!   [`KdaLayer::decode_workspace_len`] (or [`workspace_len`] before the weights exist).
//! * [`KdaLayer::new`] validates the config, the weights and the [`ForwardOptions`] (recurrent /
//!   chunked / auto, chunk size, kernel path) once; then [`KdaLayer::forward`] (packed
//!   sequences by `cu_seqlens`, in a [`Batch`]) and [`KdaLayer::decode_step`] (one token for
//!   each of N sequences) take only per-call buffers and an [`Executor`] (threads). The same
//!   calls are behind the [`KdaBackend`] trait.
//! * The components are public functions in [`ops`], each tested against the reference: the
//!   gate in `ops/gate.rs`, the conv in `ops/conv.rs`, the recurrence in `ops/recurrent.rs`,
//!   the chunked kernel in `ops/chunked.rs`, the norms in `ops/norm.rs`; the SIMD inner loops
//!   live in the private `simd/`.
//!
//! Errors are values ([`KdaError`]), never panics. NaN or ±∞ in inputs propagate to outputs.
//!
//! ```
//! use kda_core::*;
//! let cfg = KdaConfig::kimi_k3(8, 1, 4);
//! // Tiny all-f32 weights, every one 0.1 (real ones come from a checkpoint).
//! let (hd, d, k, w) = (cfg.hidden, cfg.proj_dim(), cfg.head_dim, cfg.conv_width);
//! let big = [0.1f32; 64];
//! let m = |r, c| MatRef::new("w", Data::F32(&big[..r * c]), r, c).unwrap();
//! let weights = KdaWeights {
//!     q_proj: m(d, hd), k_proj: m(d, hd), v_proj: m(d, hd),
//!     q_conv: Data::F32(&big[..d * w]), k_conv: Data::F32(&big[..d * w]),
//!     v_conv: Data::F32(&big[..d * w]),
//!     a_log: Some(Data::F32(&big[..1])), dt_bias: None,
//!     decay_proj: GateWeights::LowRank { down: m(k, hd), up: m(d, k) },
//!     b_proj: m(1, hd), output_gate: GateWeights::FullRank(m(d, hd)),
//!     o_norm: Data::F32(&big[..k]), o_proj: m(hd, d),
//! };
//! let mut state = [0.0f32; 16];
//! let (mut cq, mut ck, mut cv) = ([0.0f32; 12], [0.0f32; 12], [0.0f32; 12]);
//! let caches = CachesMut { recurrent: &mut state, conv_q: &mut cq, conv_k: &mut ck, conv_v: &mut cv };
//! // The core says how much workspace it needs; any amount from 1 token's worth works.
//! let layer = KdaLayer::new(&cfg, weights, ForwardOptions::default()).unwrap();
//! let mut ws = vec![0.0f32; layer.workspace_len(3, 1).unwrap()];
//! let x = [0.5f32; 3 * 8];
//! let mut out = [0.0f32; 3 * 8];
//! let batch = Batch { x: &x, cu_seqlens: &[0, 3], out: &mut out };
//! layer.forward(batch, caches, InitialCaches::Zero, &mut ws, &Serial).unwrap();
//! assert!(out.iter().all(|v| v.is_finite()));
//! ```
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod backend;
pub mod cache;
pub mod config;
pub mod error;
#[allow(unsafe_code)]
pub mod exec;
#[cfg(feature = "micromath")]
mod fastmath;
pub mod fixed;
#[allow(unsafe_code)]
pub mod layer;
pub mod math;
pub mod ops;
pub mod quant;
#[allow(unsafe_code)]
mod simd;
pub mod weights;

#[cfg(test)]
mod test_rng;

pub use backend::{Cpu, KdaBackend};
pub use cache::{k_first_to_v_first, v_first_to_k_first, CachesMut};
pub use config::{DecayGate, GateProj, KdaConfig};
pub use error::KdaError;
pub use exec::{Executor, Serial};
pub use fixed::{decode_step_fixed, fixed_workspace_len, FixedCachesMut, FixedWeights};
pub use layer::{
    commit_workspace_len, decode_workspace_len, forward_workspace_len, rollback_len,
    snapshot_count, snapshot_positions, validate_offsets, workspace_len, Batch, ForwardOptions,
    InitialCaches, KdaLayer, Mode, Precision, Rollback, SnapshotPos, Snapshots,
    AUTO_CHUNK_MIN_TOKENS, DEFAULT_CHUNK,
};
pub use quant::{quantize_layer, quantize_rows, quantized_len, QuantLen};
pub use simd::Isa;
pub use weights::{pack_panels, panels_len, Data, GateWeights, KdaWeights, MatRef, PANEL_ROWS};

/// Kernel entry points the crate's own criterion benches time. Not a stable API: use
/// [`KdaLayer`] and [`ops`] instead.
#[doc(hidden)]
pub mod internals {
    pub use crate::ops::linear::{
        project_scratch_len, project_tile, project_tile_pairs, PROJECT_SCRATCH,
    };
    pub use crate::simd::{DECODE_LD, DECODE_PANELS};

    /// Rounds `x` to bf16 pairs for [`project_tile_pairs`] (`out`: `x.len().div_ceil(2)`).
    pub fn round_pairs_row(
        isa: crate::Isa,
        x: &[f32],
        out: &mut [u32],
    ) -> Result<(), crate::KdaError> {
        crate::simd::round_pairs_row(isa, x, out)
    }

    /// `C[m×n] += A[m×k]·B[k×n]` (row-major, each operand with its leading dimension) on
    /// `isa`: the small GEMM of the chunked form.
    pub fn gemm_acc(
        isa: crate::Isa,
        shape: (usize, usize, usize),
        a: (&[f32], usize),
        b: (&[f32], usize),
        c: (&mut [f32], usize),
    ) -> Result<(), crate::KdaError> {
        crate::simd::gemm(isa, crate::simd::CStart::Keep, shape, a, b, c)
    }

    pub use crate::simd::ReadLoads;

    /// The sum of `data` read as `streams` interleaved regions with `isa`'s `loads` (and
    /// software prefetch when asked): the benchmarks' read-bandwidth probe.
    pub fn read_sum(
        isa: crate::Isa,
        data: &[f32],
        streams: usize,
        prefetch: bool,
        loads: ReadLoads,
    ) -> f32 {
        crate::simd::read_sum(isa, data, streams, prefetch, loads)
    }

    /// The single-core f32 FMA peak probe with `isa`'s widest vectors: independent
    /// multiply-add chains in registers. Returns (FMAs done, a value to keep the work alive).
    pub fn fma_peak(isa: crate::Isa, iters: usize) -> (usize, f32) {
        crate::simd::fma_peak(isa, iters)
    }

    /// The single-core peak of the bf16 mode's dot products (`vdpbf16ps` on avx512_bf16) on
    /// `isa`: independent chains in registers. Returns (multiply-adds done, a value to keep
    /// the work alive).
    pub fn dot_pairs_peak(isa: crate::Isa, iters: usize) -> (usize, f32) {
        crate::simd::dot_pairs_peak(isa, iters)
    }
}

/// Re-export of the `half` crate's float types used by [`Data`].
pub use half::{bf16, f16};
