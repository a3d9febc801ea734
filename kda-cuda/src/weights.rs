//! A layer's weights uploaded to the device, in the shapes the kernels and GEMMs want:
//! the projections that read `x` fused into one matrix `W_in` (see [`crate::plan::LayerDims`]),
//! the low-rank up-projections and `o_proj` as they are, and the small parameters (conv
//! weights, `A_log`, `dt_bias`, the norm weight) widened to f32.

use cudarc::driver::CudaSlice;
use kda_core::{bf16, Data, DecayGate, GateWeights, KdaConfig, KdaWeights, MatRef};

use crate::error::CudaError;
use crate::handle::CudaBackend;
use crate::params::KdaGate;
use crate::plan::{Dtype, LayerDims};

/// How weight matrices are stored on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// bf16 when every matrix is bf16 in the checkpoint, else f32 (f16 is widened exactly;
    /// int8 matrices with per-row scales are dequantised to f32 at upload).
    #[default]
    AsStored,
    /// f32 (exact for every input format): GEMMs in f32, the reference-matching path.
    F32,
    /// bf16 (f32 and f16 matrices are rounded): bf16 GEMMs with f32 accumulation.
    Bf16,
}

#[derive(Debug)]
pub(crate) enum MatData {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

/// A row-major matrix `[rows, cols]` on the device.
#[derive(Debug)]
pub(crate) struct DeviceMat {
    pub data: MatData,
    pub rows: usize,
    pub cols: usize,
}

impl DeviceMat {
    pub fn dtype(&self) -> Dtype {
        match self.data {
            MatData::F32(_) => Dtype::F32,
            MatData::Bf16(_) => Dtype::Bf16,
        }
    }

    pub fn ptr(&self, be: &CudaBackend) -> u64 {
        match &self.data {
            MatData::F32(s) => be.dev.ptr(s),
            MatData::Bf16(s) => be.dev.ptr(s),
        }
    }

    pub fn view(&self, be: &CudaBackend) -> crate::gemm::Mat {
        crate::gemm::Mat {
            ptr: self.ptr(be),
            dtype: self.dtype(),
            rows: self.rows,
            cols: self.cols,
        }
    }

    fn bytes(&self) -> usize {
        self.rows * self.cols * self.dtype().size()
    }
}

/// Appends `d` widened to f32 (exact for f32/bf16/f16; other formats, e.g. int8 with scales,
/// are dequantised element by element through [`Data::get`]).
fn push_f32(d: Data<'_>, out: &mut Vec<f32>) {
    match d {
        Data::F32(s) => out.extend_from_slice(s),
        Data::Bf16(s) => out.extend(s.iter().map(|v| v.to_f32())),
        other => out.extend((0..other.len()).map(|i| other.get(i).unwrap_or(f32::NAN))),
    }
}

/// Appends `d` as bf16 bits (f32 and other formats rounded to nearest even).
fn push_bf16(d: Data<'_>, out: &mut Vec<u16>) {
    match d {
        Data::Bf16(s) => out.extend(s.iter().map(|v| v.to_bits())),
        Data::F32(s) => out.extend(s.iter().map(|&v| bf16::from_f32(v).to_bits())),
        other => out.extend(
            (0..other.len()).map(|i| bf16::from_f32(other.get(i).unwrap_or(f32::NAN)).to_bits()),
        ),
    }
}

/// The matrix applied to `x` (full rank: the only one; low rank: the down-projection).
fn first_proj<'a>(g: GateWeights<'a>) -> MatRef<'a> {
    match g {
        GateWeights::FullRank(m) => m,
        GateWeights::LowRank { down, .. } => down,
    }
}

/// The up-projection of a low-rank gate.
fn up_proj<'a>(g: GateWeights<'a>) -> Option<MatRef<'a>> {
    match g {
        GateWeights::FullRank(_) => None,
        GateWeights::LowRank { up, .. } => Some(up),
    }
}

fn upload_mat(
    be: &CudaBackend,
    parts: &[MatRef<'_>],
    dtype: Dtype,
) -> Result<DeviceMat, CudaError> {
    if parts.iter().any(|m| m.is_panels()) {
        return Err(CudaError::Unsupported(
            "panel-layout weights (a CPU layout): pass the row-major checkpoint matrices".into(),
        ));
    }
    let cols = parts.first().map_or(0, |m| m.cols());
    let rows: usize = parts.iter().map(|m| m.rows()).sum();
    let s = &be.dev.stream;
    let data = match dtype {
        Dtype::F32 => {
            let mut v = Vec::with_capacity(rows * cols);
            for m in parts {
                push_f32(m.data(), &mut v);
            }
            v.resize(v.len().max(1), 0.0);
            MatData::F32(s.clone_htod(&v)?)
        }
        Dtype::Bf16 => {
            let mut v = Vec::with_capacity(rows * cols);
            for m in parts {
                push_bf16(m.data(), &mut v);
            }
            v.resize(v.len().max(1), 0);
            MatData::Bf16(s.clone_htod(&v)?)
        }
    };
    Ok(DeviceMat { data, rows, cols })
}

fn upload_f32(be: &CudaBackend, parts: &[Data<'_>]) -> Result<CudaSlice<f32>, CudaError> {
    let mut v = Vec::new();
    for d in parts {
        push_f32(*d, &mut v);
    }
    v.resize(v.len().max(1), 0.0);
    Ok(be.dev.stream.clone_htod(&v)?)
}

/// One layer's weights on the device.
#[derive(Debug)]
pub struct DeviceWeights {
    pub(crate) cfg: KdaConfig,
    pub(crate) dims: LayerDims,
    pub(crate) dtype: Dtype,
    pub(crate) w_in: DeviceMat,
    pub(crate) f_up: Option<DeviceMat>,
    pub(crate) g_up: Option<DeviceMat>,
    pub(crate) o_proj: DeviceMat,
    /// `[3·H·K, W]`: q, k, v conv weights.
    pub(crate) conv: CudaSlice<f32>,
    pub(crate) a_log: Option<CudaSlice<f32>>,
    pub(crate) dt_bias: Option<CudaSlice<f32>>,
    pub(crate) o_norm: CudaSlice<f32>,
    owner: u64,
}

fn all_bf16(w: &KdaWeights<'_>) -> bool {
    let mut mats = vec![w.q_proj, w.k_proj, w.v_proj, w.b_proj, w.o_proj];
    for g in [w.decay_proj, w.output_gate] {
        match g {
            GateWeights::FullRank(m) => mats.push(m),
            GateWeights::LowRank { down, up } => mats.extend([down, up]),
        }
    }
    mats.iter().all(|m| matches!(m.data(), Data::Bf16(_)))
}

impl DeviceWeights {
    /// Validates `w` against `cfg` (as the CPU does) and uploads it with matrices in `format`.
    pub fn upload(
        be: &CudaBackend,
        cfg: &KdaConfig,
        w: &KdaWeights<'_>,
        format: WeightFormat,
    ) -> Result<Self, CudaError> {
        w.validate(cfg)?;
        let dims = LayerDims::new(cfg)?;
        let dtype = match format {
            WeightFormat::F32 => Dtype::F32,
            WeightFormat::Bf16 => Dtype::Bf16,
            WeightFormat::AsStored if all_bf16(w) => Dtype::Bf16,
            WeightFormat::AsStored => Dtype::F32,
        };
        let in_parts = [
            w.q_proj,
            w.k_proj,
            w.v_proj,
            first_proj(w.decay_proj),
            w.b_proj,
            first_proj(w.output_gate),
        ];
        let w_in = upload_mat(be, &in_parts, dtype)?;
        if w_in.rows != dims.p {
            return Err(CudaError::Invalid(format!(
                "fused in-projection has {} rows, expected {}",
                w_in.rows, dims.p
            )));
        }
        let f_up = up_proj(w.decay_proj)
            .map(|m| upload_mat(be, &[m], dtype))
            .transpose()?;
        let g_up = up_proj(w.output_gate)
            .map(|m| upload_mat(be, &[m], dtype))
            .transpose()?;
        let o_proj = upload_mat(be, &[w.o_proj], dtype)?;
        let conv = upload_f32(be, &[w.q_conv, w.k_conv, w.v_conv])?;
        let a_log = w.a_log.map(|a| upload_f32(be, &[a])).transpose()?;
        let dt_bias = w.dt_bias.map(|b| upload_f32(be, &[b])).transpose()?;
        let o_norm = upload_f32(be, &[w.o_norm])?;
        Ok(DeviceWeights {
            cfg: *cfg,
            dims,
            dtype,
            w_in,
            f_up,
            g_up,
            o_proj,
            conv,
            a_log,
            dt_bias,
            o_norm,
            owner: be.dev.id,
        })
    }

    /// The configuration the weights were uploaded for.
    pub fn config(&self) -> &KdaConfig {
        &self.cfg
    }

    /// Storage format of the matrices.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Device bytes of the matrices (the small f32 parameters not counted).
    pub fn matrix_bytes(&self) -> usize {
        [
            Some(&self.w_in),
            self.f_up.as_ref(),
            self.g_up.as_ref(),
            Some(&self.o_proj),
        ]
        .into_iter()
        .flatten()
        .map(DeviceMat::bytes)
        .sum()
    }

    /// The layer dims, after checking that `cfg` is the configuration these weights are for.
    pub(crate) fn dims_for(&self, cfg: &KdaConfig) -> Result<LayerDims, CudaError> {
        if *cfg != self.cfg {
            return Err(CudaError::Invalid(
                "the weights were uploaded for another layer configuration".into(),
            ));
        }
        Ok(self.dims)
    }

    /// The decay-gate parameters for the kernels.
    pub(crate) fn gate_params(&self, be: &CudaBackend) -> KdaGate {
        let (form, lower_bound) = match self.cfg.decay_gate {
            DecayGate::Softplus => (0, 0.0),
            DecayGate::LowerBound(lb) => (1, lb),
        };
        KdaGate {
            a_log: self.a_log.as_ref().map_or(0, |s| be.dev.ptr(s)),
            dt_bias: self.dt_bias.as_ref().map_or(0, |s| be.dev.ptr(s)),
            form,
            lower_bound,
        }
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }
}
