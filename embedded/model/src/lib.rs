//! The embedded example's layer and the run that the firmware and the host both execute.
//!
//! A Kimi-K3-style KDA layer: hidden 64, 2 heads × 16, conv 4, low-rank decay projection
//! (rank 16), full-rank output gate; weights in flash ([`weights`], generated from a seed). Each
//! run goes through both decay-gate forms (lower bound −5, then softplus) with the same weights:
//! a prefill of [`T_PREFILL`] tokens, then [`T_DECODE`] decode steps. The float paths call
//! [`kda_core::KdaLayer::forward`] / [`kda_core::KdaLayer::decode_step`] with the portable
//! kernels (the only ones a Cortex-M has), so the host runs exactly the firmware's code; the
//! integer path runs every token through [`kda_core::decode_step_fixed`].
#![no_std]
#![deny(missing_docs)]

pub mod synth;
#[rustfmt::skip]
#[allow(missing_docs, clippy::approx_constant, clippy::excessive_precision)]
pub mod weights;

use kda_core::fixed::{self, FixedCachesMut};
use kda_core::{
    Batch, CachesMut, Data, DecayGate, ForwardOptions, GateProj, GateWeights, InitialCaches, Isa,
    KdaConfig, KdaError, KdaLayer, KdaWeights, MatRef, Serial,
};
use synth::{CONV, D, HEADS, HEAD_DIM, HIDDEN, RANK};

/// Prompt length (runs chunked: `Mode::Auto` chunks from 8 tokens).
pub const T_PREFILL: usize = 8;
/// Decode steps after the prompt.
pub const T_DECODE: usize = 4;
/// All tokens.
pub const T_ALL: usize = T_PREFILL + T_DECODE;

/// The two decay-gate forms the run goes through, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Kimi K3: `g = −5 · sigmoid(exp(A_log) · x)`.
    LowerBound,
    /// Kimi Linear: `g = −exp(A_log) · softplus(x)`.
    Softplus,
}

impl Gate {
    /// Both, in run order.
    pub const ALL: [Gate; 2] = [Gate::LowerBound, Gate::Softplus];

    /// Short name used in the logs.
    pub fn name(self) -> &'static str {
        match self {
            Gate::LowerBound => "lb",
            Gate::Softplus => "sp",
        }
    }
}

/// The layer configuration for `gate`.
pub fn config(gate: Gate) -> KdaConfig {
    let mut c = KdaConfig::kimi_k3(HIDDEN, HEADS, HEAD_DIM);
    c.conv_width = CONV;
    c.decay_proj = GateProj::LowRank { rank: RANK };
    c.output_gate = GateProj::FullRank;
    c.decay_gate = match gate {
        Gate::LowerBound => DecayGate::LowerBound(-5.0),
        Gate::Softplus => DecayGate::Softplus,
    };
    c
}

fn mat(
    name: &'static str,
    d: Data<'static>,
    r: usize,
    c: usize,
) -> Result<MatRef<'static>, KdaError> {
    MatRef::new(name, d, r, c)
}

/// The layer's f32 weights (flash).
pub fn f32_weights() -> Result<KdaWeights<'static>, KdaError> {
    use weights::*;
    Ok(KdaWeights {
        q_proj: mat("q_proj", Data::F32(&Q_PROJ), D, HIDDEN)?,
        k_proj: mat("k_proj", Data::F32(&K_PROJ), D, HIDDEN)?,
        v_proj: mat("v_proj", Data::F32(&V_PROJ), D, HIDDEN)?,
        q_conv: Data::F32(&Q_CONV),
        k_conv: Data::F32(&K_CONV),
        v_conv: Data::F32(&V_CONV),
        a_log: Some(Data::F32(&A_LOG)),
        dt_bias: Some(Data::F32(&DT_BIAS)),
        decay_proj: GateWeights::LowRank {
            down: mat("f_a_proj", Data::F32(&F_A_PROJ), RANK, HIDDEN)?,
            up: mat("f_b_proj", Data::F32(&F_B_PROJ), D, RANK)?,
        },
        b_proj: mat("b_proj", Data::F32(&B_PROJ), HEADS, HIDDEN)?,
        output_gate: GateWeights::FullRank(mat("g_proj", Data::F32(&G_PROJ), D, HIDDEN)?),
        o_norm: Data::F32(&O_NORM),
        o_proj: mat("o_proj", Data::F32(&O_PROJ), HIDDEN, D)?,
    })
}

/// The layer's int8 weights (flash): every matrix and the conv weights, one scale per row.
pub fn i8_weights() -> Result<KdaWeights<'static>, KdaError> {
    use weights::*;
    let q = |data: &'static [i8], scales: &'static [f32]| Data::I8 { data, scales };
    Ok(KdaWeights {
        q_proj: mat("q_proj", q(&Q_PROJ_I8, &Q_PROJ_S), D, HIDDEN)?,
        k_proj: mat("k_proj", q(&K_PROJ_I8, &K_PROJ_S), D, HIDDEN)?,
        v_proj: mat("v_proj", q(&V_PROJ_I8, &V_PROJ_S), D, HIDDEN)?,
        q_conv: q(&Q_CONV_I8, &Q_CONV_S),
        k_conv: q(&K_CONV_I8, &K_CONV_S),
        v_conv: q(&V_CONV_I8, &V_CONV_S),
        a_log: Some(Data::F32(&A_LOG)),
        dt_bias: Some(Data::F32(&DT_BIAS)),
        decay_proj: GateWeights::LowRank {
            down: mat("f_a_proj", q(&F_A_PROJ_I8, &F_A_PROJ_S), RANK, HIDDEN)?,
            up: mat("f_b_proj", q(&F_B_PROJ_I8, &F_B_PROJ_S), D, RANK)?,
        },
        b_proj: mat("b_proj", q(&B_PROJ_I8, &B_PROJ_S), HEADS, HIDDEN)?,
        output_gate: GateWeights::FullRank(mat("g_proj", q(&G_PROJ_I8, &G_PROJ_S), D, HIDDEN)?),
        o_norm: Data::F32(&O_NORM),
        o_proj: mat("o_proj", q(&O_PROJ_I8, &O_PROJ_S), HIDDEN, D)?,
    })
}

/// Recurrent state elements of one sequence.
pub const STATE: usize = HEADS * HEAD_DIM * HEAD_DIM;
/// Conv state elements (each of q, k, v) of one sequence.
pub const CONV_STATE: usize = D * (CONV - 1);
/// f32 workspace of the float runs (a prefill block of [`T_PREFILL`] tokens, chunked; checked
/// against `forward_workspace_len` at run time).
pub const WS_F32: usize = 5408;
/// i32 workspace of the integer run (`fixed_workspace_len`).
pub const WS_FIXED: usize = 194;
/// i32 parameters of the integer run (`fixed::params_len`).
pub const PARAMS_FIXED: usize = 918;

/// Where a timed region ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// A prompt: the float paths' one `forward` call over [`T_PREFILL`] tokens, or one token of
    /// the integer path's token-by-token prompt.
    Prefill,
    /// One decode step.
    Decode,
}

/// What a run reports to (printing on the firmware, collecting on the host).
pub trait Sink {
    /// A timed region starts.
    fn start(&mut self);
    /// The timed region that started last ends (`token`: the last token it processed).
    fn stop(&mut self, gate: Gate, phase: Phase, token: usize);
    /// Output rows of `tokens` (f32 paths), `[tokens.len(), HIDDEN]`.
    fn out_f32(&mut self, gate: Gate, tokens: core::ops::Range<usize>, rows: &[f32]);
    /// One token's output row, Q15.16 (integer path).
    fn out_q16(&mut self, gate: Gate, token: usize, row: &[i32]);
}

/// Buffers of a float run (kept in one struct so a firmware can place it in `.bss`).
#[derive(Debug)]
pub struct FloatBufs {
    /// Recurrent state.
    pub state: [f32; STATE],
    /// Conv states q, k, v.
    pub conv: [[f32; CONV_STATE]; 3],
    /// Workspace.
    pub ws: [f32; WS_F32],
    /// Input rows.
    pub x: [f32; T_PREFILL * HIDDEN],
    /// Output rows.
    pub out: [f32; T_PREFILL * HIDDEN],
}

impl FloatBufs {
    /// All zero.
    pub const fn new() -> Self {
        FloatBufs {
            state: [0.0; STATE],
            conv: [[0.0; CONV_STATE]; 3],
            ws: [0.0; WS_F32],
            x: [0.0; T_PREFILL * HIDDEN],
            out: [0.0; T_PREFILL * HIDDEN],
        }
    }
}

impl Default for FloatBufs {
    fn default() -> Self {
        Self::new()
    }
}

/// Input row of token `t` as f32 (exactly the Q15.16 input divided by 2^16).
pub fn input_f32(t: usize, row: &mut [f32]) {
    for (i, v) in row.iter_mut().enumerate() {
        *v = synth::input_q16(t, i) as f32 * (1.0 / 65536.0);
    }
}

/// Input row of token `t` in Q15.16.
pub fn input_q16(t: usize, row: &mut [i32]) {
    for (i, v) in row.iter_mut().enumerate() {
        *v = synth::input_q16(t, i);
    }
}

/// The float run: for each gate, a chunked prefill of [`T_PREFILL`] tokens then
/// [`T_DECODE`] decode steps, with `w` (f32 or int8 weights).
pub fn run_float(
    w: &KdaWeights<'_>,
    b: &mut FloatBufs,
    sink: &mut impl Sink,
) -> Result<(), KdaError> {
    let opts = ForwardOptions {
        isa: Some(Isa::Portable),
        ..ForwardOptions::default()
    };
    for gate in Gate::ALL {
        let cfg = config(gate);
        let need = kda_core::workspace_len(&cfg, &opts, T_PREFILL, 1)?;
        if need > b.ws.len() {
            return Err(KdaError::TooSmall {
                arg: "WS_F32",
                needed: need,
                actual: b.ws.len(),
            });
        }
        let layer = KdaLayer::new(&cfg, *w, opts)?;
        for t in 0..T_PREFILL {
            input_f32(t, &mut b.x[t * HIDDEN..(t + 1) * HIDDEN]);
        }
        let [cq, ck, cv] = &mut b.conv;
        let caches = CachesMut {
            recurrent: &mut b.state,
            conv_q: cq,
            conv_k: ck,
            conv_v: cv,
        };
        sink.start();
        let batch = Batch {
            x: &b.x,
            cu_seqlens: &[0, T_PREFILL],
            out: &mut b.out,
        };
        layer.forward(batch, caches, InitialCaches::Zero, &mut b.ws, &Serial)?;
        sink.stop(gate, Phase::Prefill, T_PREFILL - 1);
        sink.out_f32(gate, 0..T_PREFILL, &b.out);
        for t in T_PREFILL..T_ALL {
            input_f32(t, &mut b.x[..HIDDEN]);
            let [cq, ck, cv] = &mut b.conv;
            let caches = CachesMut {
                recurrent: &mut b.state,
                conv_q: cq,
                conv_k: ck,
                conv_v: cv,
            };
            sink.start();
            layer.decode_step(
                &b.x[..HIDDEN],
                &mut b.out[..HIDDEN],
                caches,
                &mut b.ws,
                &Serial,
            )?;
            sink.stop(gate, Phase::Decode, t);
            sink.out_f32(gate, t..t + 1, &b.out[..HIDDEN]);
        }
    }
    Ok(())
}

/// Buffers of an integer run.
#[derive(Debug)]
pub struct FixedBufs {
    /// Prepared integer parameters.
    pub params: [i32; PARAMS_FIXED],
    /// Recurrent state, Q15.16.
    pub state: [i32; STATE],
    /// Conv states q, k, v, Q15.16.
    pub conv: [[i32; CONV_STATE]; 3],
    /// Workspace.
    pub ws: [i32; WS_FIXED],
    /// One input row, Q15.16.
    pub x: [i32; HIDDEN],
    /// One output row, Q15.16.
    pub out: [i32; HIDDEN],
}

impl FixedBufs {
    /// All zero.
    pub const fn new() -> Self {
        FixedBufs {
            params: [0; PARAMS_FIXED],
            state: [0; STATE],
            conv: [[0; CONV_STATE]; 3],
            ws: [0; WS_FIXED],
            x: [0; HIDDEN],
            out: [0; HIDDEN],
        }
    }
}

impl Default for FixedBufs {
    fn default() -> Self {
        Self::new()
    }
}

/// The integer run: for each gate, prepare the int8 weights `w`, then all [`T_ALL`] tokens
/// one decode step at a time (the first [`T_PREFILL`] reported as prefill).
pub fn run_fixed(
    w: &KdaWeights<'_>,
    b: &mut FixedBufs,
    sink: &mut impl Sink,
) -> Result<(), KdaError> {
    for gate in Gate::ALL {
        let cfg = config(gate);
        let need = fixed::params_len(&cfg)?;
        if need > b.params.len() {
            return Err(KdaError::TooSmall {
                arg: "PARAMS_FIXED",
                needed: need,
                actual: b.params.len(),
            });
        }
        let fw = fixed::prepare(&cfg, w, &mut b.params)?;
        b.state.fill(0);
        for c in b.conv.iter_mut() {
            c.fill(0);
        }
        for t in 0..T_ALL {
            input_q16(t, &mut b.x);
            let [cq, ck, cv] = &mut b.conv;
            let caches = FixedCachesMut {
                recurrent: &mut b.state,
                conv_q: cq,
                conv_k: ck,
                conv_v: cv,
            };
            sink.start();
            fixed::decode_step_fixed(&cfg, &fw, &b.x, caches, &mut b.out, &mut b.ws)?;
            let phase = if t < T_PREFILL {
                Phase::Prefill
            } else {
                Phase::Decode
            };
            sink.stop(gate, phase, t);
            sink.out_q16(gate, t, &b.out);
        }
    }
    Ok(())
}
