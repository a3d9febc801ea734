//! A KDA layer that owns its weights (synthetic, or copied from a fixture).

use half::bf16;
use kda_core::{
    Data, DecayGate, ForwardOptions, GateProj, GateWeights, KdaConfig, KdaError, KdaLayer,
    KdaWeights, MatRef,
};

pub use crate::error::HostError;
use crate::rng::Rng;
pub use crate::runner::Runner;

/// Storage format for synthetic weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    /// f32 everywhere.
    F32,
    /// bf16 matrices and conv/norm weights (as the Kimi checkpoints ship); A_log, dt_bias f32.
    Bf16,
}

/// Owned numbers in one storage format.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedData {
    /// f32.
    F32(Vec<f32>),
    /// bf16.
    Bf16(Vec<bf16>),
}

impl OwnedData {
    /// A borrowed view.
    pub fn view(&self) -> Data<'_> {
        match self {
            OwnedData::F32(v) => Data::F32(v),
            OwnedData::Bf16(v) => Data::Bf16(v),
        }
    }

    fn from_f32(v: Vec<f32>, dtype: WeightDtype) -> Self {
        match dtype {
            WeightDtype::F32 => OwnedData::F32(v),
            WeightDtype::Bf16 => OwnedData::Bf16(v.into_iter().map(bf16::from_f32).collect()),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            OwnedData::F32(v) => 4 * v.len(),
            OwnedData::Bf16(v) => 2 * v.len(),
        }
    }
}

/// A matrix `[rows, cols]` that owns its data.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedMat {
    /// Row-major elements.
    pub data: OwnedData,
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs).
    pub cols: usize,
}

impl OwnedMat {
    fn view(&self, name: &'static str) -> Result<MatRef<'_>, KdaError> {
        MatRef::new(name, self.data.view(), self.rows, self.cols)
    }
}

/// Owned gate-projection weights.
#[derive(Debug, Clone, PartialEq)]
pub enum OwnedGate {
    /// One matrix.
    FullRank(OwnedMat),
    /// Down, then up.
    LowRank(OwnedMat, OwnedMat),
}

impl OwnedGate {
    fn view(&self, names: [&'static str; 3]) -> Result<GateWeights<'_>, KdaError> {
        Ok(match self {
            OwnedGate::FullRank(m) => GateWeights::FullRank(m.view(names[0])?),
            OwnedGate::LowRank(a, b) => GateWeights::LowRank {
                down: a.view(names[1])?,
                up: b.view(names[2])?,
            },
        })
    }

    fn bytes(&self) -> usize {
        match self {
            OwnedGate::FullRank(m) => m.data.bytes(),
            OwnedGate::LowRank(a, b) => a.data.bytes() + b.data.bytes(),
        }
    }
}

/// One KDA layer's configuration and weights, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedLayer {
    /// The configuration.
    pub cfg: KdaConfig,
    /// `q_proj`, `k_proj`, `v_proj`.
    pub qkv: [OwnedMat; 3],
    /// `q_conv1d`, `k_conv1d`, `v_conv1d` as `[H·K, W]`.
    pub conv: [OwnedData; 3],
    /// `A_log` `[H]`.
    pub a_log: Option<OwnedData>,
    /// `dt_bias` `[H·K]`.
    pub dt_bias: Option<OwnedData>,
    /// Decay projection.
    pub decay_proj: OwnedGate,
    /// `b_proj`.
    pub b_proj: OwnedMat,
    /// Output gate.
    pub output_gate: OwnedGate,
    /// `o_norm.weight` `[K]`.
    pub o_norm: OwnedData,
    /// `o_proj`.
    pub o_proj: OwnedMat,
}

impl OwnedLayer {
    /// Borrowed views for the core, checked against the configuration.
    pub fn weights(&self) -> Result<KdaWeights<'_>, KdaError> {
        let w = KdaWeights {
            q_proj: self.qkv[0].view("q_proj.weight")?,
            k_proj: self.qkv[1].view("k_proj.weight")?,
            v_proj: self.qkv[2].view("v_proj.weight")?,
            q_conv: self.conv[0].view(),
            k_conv: self.conv[1].view(),
            v_conv: self.conv[2].view(),
            a_log: self.a_log.as_ref().map(OwnedData::view),
            dt_bias: self.dt_bias.as_ref().map(OwnedData::view),
            decay_proj: self.decay_proj.view([
                "f_proj.weight",
                "f_a_proj.weight",
                "f_b_proj.weight",
            ])?,
            b_proj: self.b_proj.view("b_proj.weight")?,
            output_gate: self.output_gate.view([
                "g_proj.weight",
                "g_a_proj.weight",
                "g_b_proj.weight",
            ])?,
            o_norm: self.o_norm.view(),
            o_proj: self.o_proj.view("o_proj.weight")?,
        };
        w.validate(&self.cfg)?;
        Ok(w)
    }

    /// The validated core layer over these weights, with options `opts`.
    pub fn kda_layer(&self, opts: ForwardOptions) -> Result<KdaLayer<'_>, KdaError> {
        KdaLayer::new(&self.cfg, self.weights()?, opts)
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> usize {
        let mats = self.qkv.iter().map(|m| m.data.bytes()).sum::<usize>()
            + self.b_proj.data.bytes()
            + self.o_proj.data.bytes();
        let small = self.conv.iter().map(OwnedData::bytes).sum::<usize>()
            + self.a_log.as_ref().map_or(0, OwnedData::bytes)
            + self.dt_bias.as_ref().map_or(0, OwnedData::bytes)
            + self.o_norm.bytes();
        mats + small + self.decay_proj.bytes() + self.output_gate.bytes()
    }

    /// Seeded synthetic weights with the scales of a trained layer (activations stay O(1)).
    pub fn random(cfg: KdaConfig, dtype: WeightDtype, seed: u64) -> Result<Self, KdaError> {
        cfg.validate()?;
        let mut rng = Rng::new(seed);
        let (hd, d, h, k, w) = (
            cfg.hidden,
            cfg.proj_dim(),
            cfg.heads,
            cfg.head_dim,
            cfg.conv_width,
        );
        let mut mat = |rows: usize, cols: usize| OwnedMat {
            data: OwnedData::from_f32(rng.normals(rows * cols, 1.0 / (cols as f32).sqrt()), dtype),
            rows,
            cols,
        };
        let qkv = [mat(d, hd), mat(d, hd), mat(d, hd)];
        let gate = |form: GateProj, mat: &mut dyn FnMut(usize, usize) -> OwnedMat| match form {
            GateProj::FullRank => OwnedGate::FullRank(mat(d, hd)),
            GateProj::LowRank { rank } => OwnedGate::LowRank(mat(rank, hd), mat(d, rank)),
        };
        let decay_proj = gate(cfg.decay_proj, &mut mat);
        let output_gate = gate(cfg.output_gate, &mut mat);
        let b_proj = mat(h, hd);
        let o_proj = mat(hd, d);
        let conv = [0, 1, 2].map(|_| OwnedData::from_f32(rng.normals(d * w, 0.5), dtype));
        let a_log = (0..h).map(|_| (1.0 + 15.0 * rng.uniform()).ln()).collect();
        // dt = exp(U(ln 1e-3, ln 1e-1)); dt_bias = softplus^-1(dt) = dt + ln(1 − e^−dt).
        let dt_bias = (0..d)
            .map(|_| {
                let dt = (1e-3f32.ln() + rng.uniform() * (1e-1f32.ln() - 1e-3f32.ln())).exp();
                dt + (-(-dt).exp_m1()).ln()
            })
            .collect();
        let o_norm = OwnedData::from_f32((0..k).map(|_| 1.0 + 0.1 * rng.normal()).collect(), dtype);
        let a_log = match cfg.decay_gate {
            DecayGate::Softplus | DecayGate::LowerBound(_) => Some(OwnedData::F32(a_log)),
        };
        Ok(OwnedLayer {
            cfg,
            qkv,
            conv,
            a_log,
            dt_bias: Some(OwnedData::F32(dt_bias)),
            decay_proj,
            b_proj,
            output_gate,
            o_norm,
            o_proj,
        })
    }
}
