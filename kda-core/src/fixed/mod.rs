//! Integer-only decode path for cores without an FPU (Cortex-M0/M3, RISC-V without F).
//!
//! [`decode_step_fixed`] runs the whole layer for one token per sequence, exactly like
//! [`crate::KdaLayer::decode_step`], with int8 weights ([`crate::Data::I8`], one scale per row), fixed-point
//! activations and state, and the integer approximations of [`approx`]. No float operation is
//! executed: the f32 row scales and small parameters are turned into integers once, by
//! [`prepare`], into a caller buffer ([`params_len`]). Results are bitwise reproducible on any
//! target (integer arithmetic only), so a host run predicts a firmware run exactly.
//!
//! ## Q formats (`Qm.n`: n fractional bits in an i32)
//!
//! | quantity | format | why |
//! |---|---|---|
//! | hidden in/out, projections, conv I/O, `v`, `o`, gate logits, `dt_bias` | Q15.16 ([`ACT_FRAC`]) | range ±32768 covers any activation an f32 model produces in normal use; resolution 1.5e-5 is ~1e-4 relative at the O(0.1..1) values of a layer, 100× under the 1e-2 budget |
//! | recurrent state `S` | Q15.16 ([`STATE_FRAC`]) | with ‖k‖ = 1 and β ∈ (0,1), `Sᵀk` moves toward `v` by a convex step, so ‖S‖_F ≤ √K·max‖v‖ and `\|S\|` stays within K·max\|v\|: the same range as the activations, never overflows for \|v\| ≤ 32768/K; every update is rounded to nearest, so errors do not drift (truncation would bias the state by −½ LSB a step) |
//! | α = e^g, β, sigmoid outputs, L2-normalised (and scaled) q, k | Q1.30 ([`UNIT_FRAC`]) | all lie in [−1, 1]; 30 bits keep the decay's relative error ≤ 1e-8 a step, so 1000 steps of α ≈ 1 cost < 1e-5 |
//! | softplus output, −g = a·softplus | Q7.24 ([`GATE_FRAC`]) | e^{−t} is 0 in Q1.30 beyond t ≈ 21.5, so 7 integer bits suffice; 24 fractional bits keep α's relative error (a·ΔQ) ≤ 1e-6 for a ≤ 16 |
//! | conv weights | Q7.24 ([`CONV_FRAC`]) | \|w\| ≲ 2 in every checkpoint; 24 bits keep them exact to 6e-8 |
//! | `exp(A_log)`, `o_norm·√K` | Q15.16 | multipliers of Q15.16 / Q7.24 values |
//!
//! Products are formed in i64 (`SMULL`/`SMLAL` on Armv7-M) and rounded to nearest. Projections
//! accumulate `i8 × Q15.16` in i64 (exact; no overflow below 2^24 inputs per row) and requantise
//! once per output row by the row scale as a 15-bit multiplier and a shift. Sums of squares are
//! u64 in Q.32, so the L2 norm and the RMS norm see the exact sum.
//!
//! The layout of the caches is the f32 core's ([`crate::CachesMut`]), in i32: convert a float
//! prefill's caches with [`slice_to_q`] (state: [`STATE_FRAC`], conv: [`ACT_FRAC`]).

pub mod approx;
mod decode;

pub use decode::{decode_step_fixed, fixed_workspace_len};

use crate::config::{DecayGate, KdaConfig};
use crate::error::{add, check_len, mul, KdaError};
use crate::weights::{Data, GateWeights, KdaWeights, MatRef};

/// Fractional bits of activations (hidden in/out, projections, conv I/O, values, outputs).
pub const ACT_FRAC: u32 = 16;
/// Fractional bits of the recurrent state.
pub const STATE_FRAC: u32 = 16;
/// Fractional bits of quantities in [−1, 1] (decay, beta, sigmoid, normalised q/k).
pub const UNIT_FRAC: u32 = 30;
/// Fractional bits of the gate exponent (softplus output, −g).
pub const GATE_FRAC: u32 = 24;
/// Fractional bits of the conv weights.
pub const CONV_FRAC: u32 = 24;

/// `round(x · 2^frac)`, saturating to the i32 range (NaN → 0). Float: for the boundaries
/// (inputs, outputs, cache hand-over), not for the decode loop.
pub fn to_q(x: f32, frac: u32) -> i32 {
    let v = libm::round(x as f64 * (1u64 << frac) as f64);
    if v.is_nan() {
        0
    } else {
        v.clamp(i32::MIN as f64, i32::MAX as f64) as i32
    }
}

/// `v / 2^frac` as f32.
pub fn from_q(v: i32, frac: u32) -> f32 {
    (v as f64 / (1u64 << frac) as f64) as f32
}

/// [`to_q`] over a slice (lengths must match).
pub fn slice_to_q(src: &[f32], frac: u32, dst: &mut [i32]) -> Result<(), KdaError> {
    check_len("fixed dst", dst.len(), src.len())?;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = to_q(s, frac);
    }
    Ok(())
}

/// [`from_q`] over a slice (lengths must match).
pub fn slice_from_q(src: &[i32], frac: u32, dst: &mut [f32]) -> Result<(), KdaError> {
    check_len("float dst", dst.len(), src.len())?;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = from_q(s, frac);
    }
    Ok(())
}

/// An int8 matrix with integer requantisation per row (`[multiplier, shift]` pairs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QMat<'a> {
    pub(crate) data: &'a [i8],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// `2·rows`: multiplier in [2^14, 2^15] (0 for a zero row), shift in [1, 62].
    pub(crate) rq: &'a [i32],
}

/// A gate projection of the integer path.
#[derive(Debug, Clone, Copy)]
pub(crate) enum QGate<'a> {
    Full(QMat<'a>),
    LowRank { down: QMat<'a>, up: QMat<'a> },
}

/// A layer's weights prepared for [`decode_step_fixed`]: the int8 matrices (borrowed) and the
/// integer parameters [`prepare`] wrote into the caller's buffer.
#[derive(Debug, Clone, Copy)]
pub struct FixedWeights<'a> {
    pub(crate) cfg: KdaConfig,
    pub(crate) q_proj: QMat<'a>,
    pub(crate) k_proj: QMat<'a>,
    pub(crate) v_proj: QMat<'a>,
    pub(crate) decay: QGate<'a>,
    pub(crate) b_proj: QMat<'a>,
    pub(crate) out_gate: QGate<'a>,
    pub(crate) o_proj: QMat<'a>,
    /// q, k, v conv weights `[D, W]`, Q7.24.
    pub(crate) conv: [&'a [i32]; 3],
    /// `[D]`, Q15.16 (zeros when the layer has none).
    pub(crate) dt_bias: &'a [i32],
    /// `exp(A_log)` `[H]`, Q15.16 (1.0 when the layer has none).
    pub(crate) a: &'a [i32],
    /// `o_norm · √K` `[K]`, Q15.16 (the √K turns `rsqrt(Σo² + K·eps)` into the RMS norm).
    pub(crate) o_norm: &'a [i32],
    /// Query scale, Q1.30.
    pub(crate) scale: i32,
    /// `|lower bound|`, Q7.24 (lower-bound gate only).
    pub(crate) lb: i32,
    /// `l2_eps` in Q.32 (the unit of a sum of squares of Q15.16 values).
    pub(crate) eps_l2: u64,
    /// `K · rms_eps` in Q.32.
    pub(crate) eps_rms: u64,
}

fn mat_rows(cfg: &KdaConfig) -> usize {
    let (d, h) = (cfg.proj_dim(), cfg.heads);
    let gate = |r: usize| if r == 0 { d } else { r + d };
    3 * d + gate(cfg.decay_proj.rank()) + h + gate(cfg.output_gate.rank()) + cfg.hidden
}

/// i32 elements of the parameter buffer [`prepare`] fills.
pub fn params_len(cfg: &KdaConfig) -> Result<usize, KdaError> {
    cfg.validate()?;
    let d = cfg.proj_dim();
    let rq = mul("fixed params", 2, mat_rows(cfg))?;
    let conv = mul("fixed params", 3 * d, cfg.conv_width)?;
    let small = d + cfg.heads + cfg.head_dim;
    add("fixed params", add("fixed params", rq, conv)?, small)
}

/// Splits consecutive pieces off the parameter buffer.
struct Params<'a> {
    rest: &'a mut [i32],
}

impl<'a> Params<'a> {
    fn take(&mut self, n: usize) -> &'a mut [i32] {
        let (a, b) = core::mem::take(&mut self.rest).split_at_mut(n);
        self.rest = b;
        a
    }

    fn mat(&mut self, m: &MatRef<'a>, name: &'static str) -> Result<QMat<'a>, KdaError> {
        let Data::I8 { data, scales } = m.data() else {
            return Err(KdaError::Weights {
                arg: name,
                reason: "the integer path needs int8 weights (quant::quantize_layer)",
            });
        };
        if scales.len() != m.rows() {
            return Err(KdaError::Weights {
                arg: name,
                reason: "the integer path needs one int8 scale per row",
            });
        }
        let rq = self.take(2 * m.rows());
        for (pair, &s) in rq.chunks_exact_mut(2).zip(scales) {
            let (mult, shift) = requant(s, name)?;
            pair[0] = mult;
            pair[1] = shift;
        }
        Ok(QMat {
            data,
            rows: m.rows(),
            cols: m.cols(),
            rq,
        })
    }

    fn gate(&mut self, g: &GateWeights<'a>, name: &'static str) -> Result<QGate<'a>, KdaError> {
        Ok(match g {
            GateWeights::FullRank(m) => QGate::Full(self.mat(m, name)?),
            GateWeights::LowRank { down, up } => QGate::LowRank {
                down: self.mat(down, name)?,
                up: self.mat(up, name)?,
            },
        })
    }

    fn vector(
        &mut self,
        src: Option<Data<'_>>,
        n: usize,
        frac: u32,
        f: impl Fn(f32) -> f32,
        default: f32,
    ) -> &'a [i32] {
        let out = self.take(n);
        for (i, o) in out.iter_mut().enumerate() {
            let v = src.and_then(|s| s.get_dense(i)).unwrap_or(default);
            *o = to_q(f(v), frac);
        }
        out
    }
}

/// A row scale `s` as `(m, e)` with `s ≈ m · 2^{−e}`, `m ∈ [2^14, 2^15]`, `e ∈ [1, 62]`.
fn requant(s: f32, name: &'static str) -> Result<(i32, i32), KdaError> {
    if !(s.is_finite() && s >= 0.0) {
        return Err(KdaError::Weights {
            arg: name,
            reason: "int8 scales must be finite and non-negative",
        });
    }
    if s == 0.0 {
        return Ok((0, 1));
    }
    let (mut m, mut e) = (s as f64, 0i32);
    while m < 16384.0 && e < 62 {
        m *= 2.0;
        e += 1;
    }
    while m >= 32768.0 {
        m /= 2.0;
        e -= 1;
    }
    if e < 1 {
        return Err(KdaError::Weights {
            arg: name,
            reason: "int8 scale too large for the integer path (≥ 2^14)",
        });
    }
    Ok((libm::round(m) as i32, e))
}

/// Prepares `w` (every matrix int8 with one scale per row, e.g. from
/// [`crate::quant::quantize_layer`]) for [`decode_step_fixed`], writing the integer parameters
/// into `params` (at least [`params_len`] elements). Float arithmetic happens here, once.
pub fn prepare<'a>(
    cfg: &KdaConfig,
    w: &KdaWeights<'a>,
    params: &'a mut [i32],
) -> Result<FixedWeights<'a>, KdaError> {
    w.validate(cfg)?;
    let need = params_len(cfg)?;
    if params.len() < need {
        return Err(KdaError::TooSmall {
            arg: "fixed params",
            needed: need,
            actual: params.len(),
        });
    }
    let lb = match cfg.decay_gate {
        DecayGate::Softplus => 0,
        DecayGate::LowerBound(lb) if lb > -127.0 => to_q(-lb, GATE_FRAC),
        DecayGate::LowerBound(_) => {
            return Err(KdaError::Config {
                field: "decay_gate",
                reason: "the integer path needs a lower bound above −127",
            })
        }
    };
    let scale = cfg.scale();
    if scale.is_nan() || scale.abs() >= 2.0 {
        return Err(KdaError::Config {
            field: "scale",
            reason: "the integer path needs |scale| < 2",
        });
    }
    let (d, h, k, cw) = (cfg.proj_dim(), cfg.heads, cfg.head_dim, cfg.conv_width);
    let mut p = Params { rest: params };
    let q_proj = p.mat(&w.q_proj, "q_proj.weight")?;
    let k_proj = p.mat(&w.k_proj, "k_proj.weight")?;
    let v_proj = p.mat(&w.v_proj, "v_proj.weight")?;
    let decay = p.gate(&w.decay_proj, "decay projection")?;
    let b_proj = p.mat(&w.b_proj, "b_proj.weight")?;
    let out_gate = p.gate(&w.output_gate, "output gate projection")?;
    let o_proj = p.mat(&w.o_proj, "o_proj.weight")?;
    let id = |v: f32| v;
    let conv =
        [w.q_conv, w.k_conv, w.v_conv].map(|c| p.vector(Some(c), d * cw, CONV_FRAC, id, 0.0));
    let dt_bias = p.vector(w.dt_bias, d, ACT_FRAC, id, 0.0);
    let a = p.vector(w.a_log, h, ACT_FRAC, libm::expf, 0.0);
    let sqrt_k = libm::sqrtf(k as f32);
    let o_norm = p.vector(Some(w.o_norm), k, ACT_FRAC, |v| v * sqrt_k, 0.0);
    let q32 = |e: f32| libm::round(e as f64 * 4_294_967_296.0) as u64;
    Ok(FixedWeights {
        cfg: *cfg,
        q_proj,
        k_proj,
        v_proj,
        decay,
        b_proj,
        out_gate,
        o_proj,
        conv,
        dt_bias,
        a,
        o_norm,
        scale: to_q(scale, UNIT_FRAC),
        lb,
        eps_l2: q32(cfg.l2_eps),
        eps_rms: q32(cfg.rms_eps * k as f32),
    })
}

/// Mutable views of `N` sequences' caches for the integer path: the f32 core's layouts
/// ([`crate::CachesMut`]) in i32, the state in Q15.16 ([`STATE_FRAC`]), the conv histories in
/// Q15.16 ([`ACT_FRAC`]).
#[derive(Debug)]
pub struct FixedCachesMut<'a> {
    /// Recurrent states `[N, H, K, V]`, K-first.
    pub recurrent: &'a mut [i32],
    /// q conv states `[N, H·K, W−1]`.
    pub conv_q: &'a mut [i32],
    /// k conv states `[N, H·K, W−1]`.
    pub conv_k: &'a mut [i32],
    /// v conv states `[N, H·K, W−1]`.
    pub conv_v: &'a mut [i32],
}

impl FixedCachesMut<'_> {
    /// Checks that the slices hold exactly `n` sequences' caches for `cfg`.
    pub fn validate(&self, cfg: &KdaConfig, n: usize) -> Result<(), KdaError> {
        let lens = [self.conv_q.len(), self.conv_k.len(), self.conv_v.len()];
        crate::cache::check_cache_lens(cfg, n, self.recurrent.len(), lens)
    }

    /// Zeroes every cache.
    pub fn reset(&mut self) {
        self.recurrent.fill(0);
        self.conv_q.fill(0);
        self.conv_k.fill(0);
        self.conv_v.fill(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requant_represents_scales() {
        for s in [1e-6f32, 3.7e-3, 0.0125, 0.5, 1.0, 1000.0] {
            let (m, e) = requant(s, "w").unwrap();
            assert!((16384..=32768).contains(&m), "{s}: {m}");
            let back = m as f64 / (1u64 << e) as f64;
            assert!((back / s as f64 - 1.0).abs() <= 1.0 / 32768.0, "{s}");
        }
        assert_eq!(requant(0.0, "w").unwrap(), (0, 1));
        assert!(requant(f32::NAN, "w").is_err());
        assert!(requant(1e6, "w").is_err());
    }

    #[test]
    fn conversions_saturate() {
        assert_eq!(to_q(1.5, 16), 98304);
        assert_eq!(to_q(1e12, 16), i32::MAX);
        assert_eq!(to_q(-1e12, 16), i32::MIN);
        assert_eq!(to_q(f32::NAN, 16), 0);
        assert_eq!(from_q(98304, 16), 1.5);
    }
}
