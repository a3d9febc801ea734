//! # kda-core
//!
//! Kimi Delta Attention — the gated delta-rule linear attention of Kimi Linear and Kimi K3 —
//! as a `no_std`, allocation-free layer over caller-provided slices.
//!
//! ```
//! use kda_core::*;
//!
//! // A small Kimi K3 layer: hidden 8, 2 heads of dim 4.
//! let cfg = KdaConfig::kimi_k3(8, 2, 4);
//! let (hd, d, h, k, w) = (cfg.hidden, cfg.proj_dim(), cfg.heads, cfg.head_dim, cfg.conv_width);
//!
//! // f32 weights borrowed from one caller-owned buffer of deterministic values (real ones
//! // come from a checkpoint: f32, bf16 or f16, `[out, in]` row-major).
//! let pool: Vec<f32> = (0..512).map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0).collect();
//! let data = |at: usize, n: usize| Data::F32(&pool[at..at + n]);
//! let mat = |at: usize, r: usize, c: usize| MatRef::new("w", data(at, r * c), r, c);
//! let weights = KdaWeights {
//!     q_proj: mat(0, d, hd)?,
//!     k_proj: mat(64, d, hd)?,
//!     v_proj: mat(128, d, hd)?,
//!     q_conv: data(192, d * w),
//!     k_conv: data(224, d * w),
//!     v_conv: data(256, d * w),
//!     a_log: Some(data(288, h)),
//!     dt_bias: None,
//!     decay_proj: GateWeights::LowRank { down: mat(290, k, hd)?, up: mat(322, d, k)? },
//!     b_proj: mat(354, h, hd)?,
//!     output_gate: GateWeights::FullRank(mat(370, d, hd)?),
//!     o_norm: data(434, k),
//!     o_proj: mat(438, hd, d)?,
//! };
//! // Checked once: config, weight shapes, options. Decode always runs recurrent; a recurrent
//! // prefill gives it the same arithmetic.
//! let layer = KdaLayer::new(&cfg, weights, ForwardOptions::recurrent())?;
//!
//! // One sequence's caches (the recurrent state, the q/k/v conv states), sized by the config.
//! let (s, c) = (cfg.state_len()?, cfg.conv_state_len()?);
//! let fresh = [vec![0.0f32; s], vec![0.0; c], vec![0.0; c], vec![0.0; c]];
//! fn caches(c: &mut [Vec<f32>; 4]) -> CachesMut<'_> {
//!     let [recurrent, conv_q, conv_k, conv_v] = c;
//!     CachesMut { recurrent, conv_q, conv_k, conv_v }
//! }
//!
//! // T + 1 = 5 tokens, `[T + 1, hidden]` rows.
//! let t = 4;
//! let x: Vec<f32> = (0..(t + 1) * hd).map(|i| ((i * 13 % 17) as f32 - 8.0) / 8.0).collect();
//! // The core says how much workspace a call needs (any amount from one token's worth works,
//! // in more blocks).
//! let mut ws = vec![0.0f32; layer.workspace_len(t + 1, 1)?];
//!
//! // All T + 1 tokens in one forward.
//! let (mut whole_caches, mut whole) = (fresh.clone(), vec![0.0f32; (t + 1) * hd]);
//! let batch = Batch { x: &x, cu_seqlens: &[0, t + 1], out: &mut whole };
//! layer.forward(batch, caches(&mut whole_caches), InitialCaches::Zero, &mut ws, &Serial)?;
//!
//! // A prefill of T tokens, then one decode step for the last.
//! let (mut step_caches, mut out) = (fresh.clone(), vec![0.0f32; (t + 1) * hd]);
//! let (prompt_out, next_out) = out.split_at_mut(t * hd);
//! let batch = Batch { x: &x[..t * hd], cu_seqlens: &[0, t], out: prompt_out };
//! layer.forward(batch, caches(&mut step_caches), InitialCaches::Zero, &mut ws, &Serial)?;
//! let mut decode_ws = vec![0.0f32; layer.decode_workspace_len(1, 1)?];
//! let next = &x[t * hd..];
//! layer.decode_step(next, next_out, caches(&mut step_caches), &mut decode_ws, &Serial)?;
//!
//! // The decode step continues the prefill exactly: the same outputs and caches, bit for bit.
//! let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
//! assert!(whole.iter().all(|v| v.is_finite()) && whole.iter().any(|&v| v != 0.0));
//! assert_eq!(bits(&out), bits(&whole));
//! assert_eq!(bits(&step_caches.concat()), bits(&whole_caches.concat()));
//! # Ok::<(), KdaError>(())
//! ```
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
//!   the chunked kernel in `ops/chunked/`, the norms in `ops/norm.rs`; the SIMD inner loops
//!   live in the private `simd/`.
//!
//! Errors are values ([`KdaError`]), never panics. NaN or ±∞ in inputs propagate to outputs.
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
        project_scratch_len, project_tile, project_tile_pairs, Tile, TileRows, PROJECT_SCRATCH,
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

/// The README's Rust examples, run as doctests so the published page stays correct.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
