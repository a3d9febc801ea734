//! Int8 weights: symmetric quantisation with one f32 scale per output row ([`crate::Data::I8`]).
//!
//! `w[o, i] ≈ scales[o] · q[o, i]` with `q ∈ [−127, 127]` and `scales[o] = max_i |w[o, i]| / 127`
//! (a zero row gets scale 0). The rounding error of each weight is at most half a step,
//! `scales[o] / 2`, i.e. `max|w[o]| / 254`.
//!
//! **Accumulation.** On the f32 paths of the core (every projection of [`crate::KdaLayer::forward`] and
//! [`crate::KdaLayer::decode_step`], recurrent or chunked, any [`crate::Isa`]) a row product is
//! `scale · Σ x[i]·(q[i] as f32)`: the int8 values widen exactly to f32 and accumulate in f32
//! with the same eight-lane order as the f32 weights, and the scale is applied once per row.
//! The activations stay f32, so nothing else is quantised, and on a core with an FPU the
//! widening (`vcvt`) costs one instruction per weight. Integer accumulation would first need
//! the activations quantised too: that is what the integer-only path ([`crate::fixed`]) does,
//! with `i8 × i32` products summed in i64 (`SMLAL` on Armv7-M).
//!
//! The helpers write into caller buffers (no allocation), so a host tool and a firmware
//! build can both use them: [`quantize_rows`] for one matrix, [`quantize_layer`] for every
//! matrix of a layer at once ([`quantized_len`] sizes the buffers).

use crate::config::KdaConfig;
use crate::error::{add, check_len, mul, rows_of, KdaError};
#[cfg(test)]
use crate::ops::linear::dot_i8;
use crate::weights::{Data, GateWeights, KdaWeights, MatRef};

/// Largest quantised magnitude (symmetric: −128 is never produced).
pub const I8_MAX: f32 = 127.0;

/// Quantises `src` (`rows · cols` values in any [`Data`] format, row-major) into `out`
/// (`rows · cols` int8) and `scales` (`rows`), symmetric per row. Errors on a length mismatch
/// or a non-finite weight (which has no int8 image).
pub fn quantize_rows(
    src: Data<'_>,
    rows: usize,
    out: &mut [i8],
    scales: &mut [f32],
) -> Result<(), KdaError> {
    check_len("quantize scales", scales.len(), rows)?;
    check_len("quantize out", out.len(), src.len())?;
    if rows == 0 {
        return if src.is_empty() {
            Ok(())
        } else {
            Err(KdaError::Length {
                arg: "quantize src",
                expected: 0,
                actual: src.len(),
            })
        };
    }
    let cols = rows_of("quantize src", src.len(), rows)?;
    if cols == 0 {
        scales.fill(0.0);
        return Ok(());
    }
    for (r, (orow, s)) in out
        .chunks_exact_mut(cols)
        .zip(scales.iter_mut())
        .enumerate()
    {
        let mut amax = 0.0f32;
        for i in 0..cols {
            let v = src.get(r * cols + i).unwrap_or(f32::NAN);
            if !v.is_finite() {
                return Err(KdaError::Weights {
                    arg: "quantize src",
                    reason: "non-finite weight cannot be quantised",
                });
            }
            amax = amax.max(libm::fabsf(v));
        }
        if amax == 0.0 {
            *s = 0.0;
            orow.fill(0);
            continue;
        }
        *s = amax / I8_MAX;
        let inv = I8_MAX / amax;
        for (i, q) in orow.iter_mut().enumerate() {
            let v = src.get(r * cols + i).unwrap_or(0.0);
            *q = libm::roundf(v * inv).clamp(-I8_MAX, I8_MAX) as i8;
        }
    }
    Ok(())
}

/// Sizes of the buffers [`quantize_layer`] needs: int8 elements and f32 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct QuantLen {
    /// Int8 elements (every matrix, plus the conv weights when quantised).
    pub weights: usize,
    /// Scales (one per matrix row, plus one per conv channel when quantised).
    pub scales: usize,
}

fn mats(cfg: &KdaConfig) -> [(usize, usize); 9] {
    let (hd, d, h) = (cfg.hidden, cfg.proj_dim(), cfg.heads);
    let gate = |r: usize| -> [(usize, usize); 2] {
        if r == 0 {
            [(d, hd), (0, 0)]
        } else {
            [(r, hd), (d, r)]
        }
    };
    let [f0, f1] = gate(cfg.decay_proj.rank());
    let [g0, g1] = gate(cfg.output_gate.rank());
    [(d, hd), (d, hd), (d, hd), f0, f1, (h, hd), g0, g1, (hd, d)]
}

/// Buffer sizes for [`quantize_layer`] (`conv`: whether the conv weights are quantised too).
pub fn quantized_len(cfg: &KdaConfig, conv: bool) -> Result<QuantLen, KdaError> {
    cfg.validate()?;
    let (mut weights, mut scales) = (0usize, 0usize);
    for (r, c) in mats(cfg) {
        weights = add(
            "quantized weights",
            weights,
            mul("quantized weights", r, c)?,
        )?;
        scales = add("quantized scales", scales, r)?;
    }
    if conv {
        let d = cfg.proj_dim();
        weights = add(
            "quantized weights",
            weights,
            mul("conv", 3 * d, cfg.conv_width)?,
        )?;
        scales = add("quantized scales", scales, 3 * d)?;
    }
    Ok(QuantLen { weights, scales })
}

/// Hands out consecutive pieces of the two caller buffers.
struct Bufs<'a> {
    q: &'a mut [i8],
    s: &'a mut [f32],
}

impl<'a> Bufs<'a> {
    fn take(&mut self, src: Data<'_>, rows: usize) -> Result<Data<'a>, KdaError> {
        let n = src.len();
        let (q, qr) = core::mem::take(&mut self.q).split_at_mut(n);
        let (s, sr) = core::mem::take(&mut self.s).split_at_mut(rows);
        self.q = qr;
        self.s = sr;
        quantize_rows(src, rows, q, s)?;
        Ok(Data::I8 { data: q, scales: s })
    }

    fn mat(&mut self, m: &MatRef<'_>, name: &'static str) -> Result<MatRef<'a>, KdaError> {
        if m.is_panels() {
            return Err(KdaError::Weights {
                arg: name,
                reason: "int8 quantisation needs row-major weights, not the panel layout",
            });
        }
        let d = self.take(m.data(), m.rows())?;
        MatRef::new(name, d, m.rows(), m.cols())
    }

    fn gate(&mut self, g: &GateWeights<'_>) -> Result<GateWeights<'a>, KdaError> {
        Ok(match g {
            GateWeights::FullRank(m) => GateWeights::FullRank(self.mat(m, "gate")?),
            GateWeights::LowRank { down, up } => GateWeights::LowRank {
                down: self.mat(down, "gate down")?,
                up: self.mat(up, "gate up")?,
            },
        })
    }
}

/// Quantises every matrix of `w` (q/k/v, decay and output-gate projections, `b_proj`,
/// `o_proj`) and, with `conv`, the three conv weights (one scale per channel) into the caller's
/// buffers (at least [`quantized_len`]), and returns the layer's weights viewing them. The
/// small parameters (`A_log`, `dt_bias`, `o_norm`) stay as they are.
pub fn quantize_layer<'a>(
    cfg: &KdaConfig,
    w: &KdaWeights<'a>,
    q: &'a mut [i8],
    scales: &'a mut [f32],
    conv: bool,
) -> Result<KdaWeights<'a>, KdaError> {
    w.validate(cfg)?;
    let need = quantized_len(cfg, conv)?;
    if q.len() < need.weights {
        return Err(KdaError::TooSmall {
            arg: "quantized weights",
            needed: need.weights,
            actual: q.len(),
        });
    }
    if scales.len() < need.scales {
        return Err(KdaError::TooSmall {
            arg: "quantized scales",
            needed: need.scales,
            actual: scales.len(),
        });
    }
    let mut b = Bufs { q, s: scales };
    let d = cfg.proj_dim();
    let cv = |c: Data<'a>, b: &mut Bufs<'a>| if conv { b.take(c, d) } else { Ok(c) };
    let out = KdaWeights {
        q_proj: b.mat(&w.q_proj, "q_proj.weight")?,
        k_proj: b.mat(&w.k_proj, "k_proj.weight")?,
        v_proj: b.mat(&w.v_proj, "v_proj.weight")?,
        decay_proj: b.gate(&w.decay_proj)?,
        b_proj: b.mat(&w.b_proj, "b_proj.weight")?,
        output_gate: b.gate(&w.output_gate)?,
        o_proj: b.mat(&w.o_proj, "o_proj.weight")?,
        q_conv: cv(w.q_conv, &mut b)?,
        k_conv: cv(w.k_conv, &mut b)?,
        v_conv: cv(w.v_conv, &mut b)?,
        a_log: w.a_log,
        dt_bias: w.dt_bias,
        o_norm: w.o_norm,
    };
    out.validate(cfg)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_half_a_step() {
        let w: [f32; 8] = [0.5, -1.0, 0.25, 0.0, 3.0, -3.0, 1.5, 0.001];
        let (mut q, mut s) = ([0i8; 8], [0f32; 2]);
        quantize_rows(Data::F32(&w), 2, &mut q, &mut s).unwrap();
        assert_eq!(q[1], -127);
        assert_eq!(q[4], 127);
        let d = Data::I8 {
            data: &q,
            scales: &s,
        };
        for (i, &v) in w.iter().enumerate() {
            assert!((d.get(i).unwrap() - v).abs() <= s[i / 4] / 2.0 + 1e-7);
        }
    }

    #[test]
    fn zero_rows_and_bad_input() {
        let (mut q, mut s) = ([1i8; 4], [1f32; 2]);
        quantize_rows(Data::F32(&[0.0; 4]), 2, &mut q, &mut s).unwrap();
        assert_eq!((q, s), ([0; 4], [0.0; 2]));
        assert!(quantize_rows(Data::F32(&[f32::NAN; 4]), 2, &mut q, &mut s).is_err());
        assert!(quantize_rows(Data::F32(&[0.0; 3]), 2, &mut q[..3], &mut s).is_err());
    }

    #[test]
    fn malformed_i8_has_no_length_and_slices_keep_scales() {
        let q = [1i8, 2, 3, 4, 5, 6];
        assert_eq!(
            Data::I8 {
                data: &q,
                scales: &[]
            }
            .len(),
            0
        );
        assert_eq!(
            Data::I8 {
                data: &q,
                scales: &[1.0; 4]
            }
            .len(),
            0
        );
        let d = Data::I8 {
            data: &q,
            scales: &[1.0, 10.0, 100.0],
        };
        assert_eq!(d.len(), 6);
        assert_eq!(d.get(5), Some(600.0));
        let row = d.slice(2, 2);
        assert_eq!((row.at(0), row.at(1)), (30.0, 40.0));
        let inner = d.slice(3, 1);
        assert_eq!(inner.at(0), 40.0);
        let two = d.slice(2, 4);
        assert_eq!(two.at(3), 600.0);
        assert_eq!(dot_i8(&[1.0; 4], &q[2..], &[10.0, 100.0]), 70.0 + 1100.0);
    }
}
