//! The tensors of one KDA layer in a Kimi checkpoint: their names, the shapes each may be
//! stored in, and the loaded (in-place or copied) form.
//!
//! | suffix (after `…layers.{i}.self_attn.`) | accepted shapes |
//! |---|---|
//! | `q_proj.weight`, `k_proj.weight`, `v_proj.weight` | `[P, D]` |
//! | `q_conv1d.weight`, `k_conv1d.weight`, `v_conv1d.weight` | `[P, 1, W]` or `[P, W]` |
//! | `A_log` | `[H]`, `[1, 1, H, 1]`, `[H, 1]`, or `[≥H]` zero-padded (the first H are used) |
//! | `dt_bias` | `[P]` or `[H, K]` |
//! | `f_a_proj.weight`, `f_b_proj.weight` | `[r, D]`, `[P, r]` |
//! | `b_proj.weight` | `[H, D]` |
//! | `g_proj.weight` (full-rank) or `g_a_proj.weight`, `g_b_proj.weight` | `[P, D]` or `[r, D]`, `[P, r]` |
//! | `o_norm.weight` | `[K]` |
//! | `o_proj.weight` | `[D, P]` |
//!
//! with `D` = hidden, `H` heads, `K` head dim, `P = H·K`, `W` the conv width. Every tensor may be
//! F32, BF16 or F16.

use std::ops::Range;

use kda_core::quant::{BlockFormat, Blocks};
use kda_core::{Data, GateWeights, KdaConfig, KdaWeights, MatRef};

use super::ct::views::{GroupSpec, GroupViews};
use super::safetensors::{view_in_place, FloatDtype, FloatVec, SafetensorsFile};
use crate::error::{HostError, Result};

/// Where a loaded weight's values live.
#[derive(Debug, Clone, PartialEq)]
pub enum Storage {
    /// In place: this byte range of file number `file` of the model (aligned, little-endian).
    InPlace {
        /// Index into the model's files.
        file: usize,
        /// Byte range of the elements used.
        range: Range<usize>,
    },
    /// Copied out (the bytes were misaligned for the element type).
    Copied(FloatVec),
    /// compressed-tensors `pack-quantized` groups, in place (matrices only; see
    /// [`super::ct`]).
    Groups(Box<GroupSpec>),
    /// GGUF quantisation blocks, in place: this byte range of file number `file` (matrices
    /// only; see [`super::gguf::load`]).
    Blocks {
        /// Index into the model's files.
        file: usize,
        /// Byte range of the blocks.
        range: Range<usize>,
        /// The block format.
        format: BlockFormat,
    },
}

/// One weight tensor of a loaded layer.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightTensor {
    /// Full name in the checkpoint.
    pub name: String,
    /// Stored dtype (of the scales, for quantised groups and GGUF blocks).
    pub dtype: FloatDtype,
    /// Stored shape (the logical `[rows, cols]` for quantised groups).
    pub shape: Vec<usize>,
    /// Elements used (all of them, except for a padded `A_log`).
    pub used: usize,
    /// Where the values are.
    pub storage: Storage,
}

impl WeightTensor {
    /// The values, borrowed from `files` (in place) or from the copy.
    pub fn data<'a>(&'a self, files: &'a [SafetensorsFile]) -> Result<Data<'a>> {
        match &self.storage {
            Storage::Copied(v) => Ok(v.view()),
            Storage::InPlace { file, range } => files
                .get(*file)
                .and_then(|f| f.buffer.get(range.clone()))
                .and_then(|raw| view_in_place(raw, self.dtype))
                .ok_or_else(|| {
                    HostError::Invalid(format!(
                        "internal: tensor `{}` is no longer addressable in place",
                        self.name
                    ))
                }),
            Storage::Groups(_) | Storage::Blocks { .. } => Err(HostError::Invalid(format!(
                "internal: quantised tensor `{}` used as a vector",
                self.name
            ))),
        }
    }

    /// Bytes of the values used.
    pub fn bytes(&self) -> usize {
        match &self.storage {
            Storage::Groups(g) => g.stored_bytes(),
            Storage::Blocks { range, .. } => range.len(),
            _ => self.used * self.dtype.size(),
        }
    }

    /// True when the values are used in place (not copied).
    pub fn in_place(&self) -> bool {
        matches!(
            self.storage,
            Storage::InPlace { .. } | Storage::Groups(_) | Storage::Blocks { .. }
        )
    }

    fn mat<'a>(&'a self, src: Src<'a>, name: &'static str) -> Result<MatRef<'a>> {
        let rows = self.shape.first().copied().unwrap_or(1);
        let cols = self.shape.iter().skip(1).product();
        let data = match &self.storage {
            Storage::Groups(g) => Data::Groups(src.groups.get(g)?.all_rows()),
            Storage::Blocks {
                file,
                range,
                format,
            } => {
                let bytes = src
                    .files
                    .get(*file)
                    .and_then(|f| f.buffer.get(range.clone()))
                    .unwrap_or_default();
                Data::Blocks(Blocks::new(
                    name,
                    *format,
                    bytes,
                    rows.saturating_mul(cols),
                )?)
            }
            _ => self.data(src.files)?,
        };
        Ok(MatRef::new(name, data, rows, cols)?)
    }
}

/// What a layer's weights are borrowed from: the model's files and the views of its
/// quantised matrices.
#[derive(Debug, Clone, Copy)]
pub struct Src<'a> {
    /// The weight files.
    pub files: &'a [SafetensorsFile],
    /// The quantised matrices' views.
    pub groups: &'a GroupViews<'a>,
}

impl<'a> Src<'a> {
    /// Files with no quantised matrices.
    pub fn files(files: &'a [SafetensorsFile]) -> Self {
        const NONE: &GroupViews<'static> = &GroupViews::EMPTY;
        Src {
            files,
            groups: NONE,
        }
    }
}

/// A gate projection's tensors.
#[derive(Debug, Clone, PartialEq)]
pub enum GateTensors {
    /// One matrix (`g_proj`).
    FullRank(WeightTensor),
    /// Down then up (`f_a_proj`/`f_b_proj`, `g_a_proj`/`g_b_proj`).
    LowRank(WeightTensor, WeightTensor),
}

impl GateTensors {
    fn view<'a>(&'a self, src: Src<'a>, names: [&'static str; 3]) -> Result<GateWeights<'a>> {
        Ok(match self {
            GateTensors::FullRank(m) => GateWeights::FullRank(m.mat(src, names[0])?),
            GateTensors::LowRank(a, b) => GateWeights::LowRank {
                down: a.mat(src, names[1])?,
                up: b.mat(src, names[2])?,
            },
        })
    }

    /// The tensors, in order.
    pub fn tensors(&self) -> Vec<&WeightTensor> {
        match self {
            GateTensors::FullRank(m) => vec![m],
            GateTensors::LowRank(a, b) => vec![a, b],
        }
    }
}

/// All tensors of one KDA layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerTensors {
    /// `q_proj`, `k_proj`, `v_proj`.
    pub qkv: [WeightTensor; 3],
    /// `q_conv1d`, `k_conv1d`, `v_conv1d`.
    pub conv: [WeightTensor; 3],
    /// `A_log` (the first H values).
    pub a_log: WeightTensor,
    /// `dt_bias`.
    pub dt_bias: WeightTensor,
    /// `f_a_proj`/`f_b_proj`.
    pub decay_proj: GateTensors,
    /// `b_proj`.
    pub b_proj: WeightTensor,
    /// `g_proj`, or `g_a_proj`/`g_b_proj`.
    pub output_gate: GateTensors,
    /// `o_norm.weight`.
    pub o_norm: WeightTensor,
    /// `o_proj`.
    pub o_proj: WeightTensor,
}

impl LayerTensors {
    /// Every tensor, in checkpoint order.
    pub fn all(&self) -> Vec<&WeightTensor> {
        let mut v: Vec<&WeightTensor> = self.qkv.iter().chain(&self.conv).collect();
        v.push(&self.a_log);
        v.push(&self.dt_bias);
        v.extend(self.decay_proj.tensors());
        v.push(&self.b_proj);
        v.extend(self.output_gate.tensors());
        v.push(&self.o_norm);
        v.push(&self.o_proj);
        v
    }

    /// Borrowed views for the core (checked against `cfg`).
    pub fn weights<'a>(&'a self, cfg: &KdaConfig, src: Src<'a>) -> Result<KdaWeights<'a>> {
        let files = src.files;
        let w = KdaWeights {
            q_proj: self.qkv[0].mat(src, "q_proj.weight")?,
            k_proj: self.qkv[1].mat(src, "k_proj.weight")?,
            v_proj: self.qkv[2].mat(src, "v_proj.weight")?,
            q_conv: self.conv[0].data(files)?,
            k_conv: self.conv[1].data(files)?,
            v_conv: self.conv[2].data(files)?,
            a_log: Some(self.a_log.data(files)?),
            dt_bias: Some(self.dt_bias.data(files)?),
            decay_proj: self
                .decay_proj
                .view(src, ["f_proj.weight", "f_a_proj.weight", "f_b_proj.weight"])?,
            b_proj: self.b_proj.mat(src, "b_proj.weight")?,
            output_gate: self
                .output_gate
                .view(src, ["g_proj.weight", "g_a_proj.weight", "g_b_proj.weight"])?,
            o_norm: self.o_norm.data(files)?,
            o_proj: self.o_proj.mat(src, "o_proj.weight")?,
        };
        w.validate(cfg)?;
        Ok(w)
    }
}

/// Which KDA tensor a name stands for, and so which shapes it may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `q_proj`, `k_proj`, `v_proj`, `g_proj`: `[P, D]`.
    ProjIn,
    /// `o_proj`: `[D, P]`.
    ProjOut,
    /// A short-conv weight: `[P, 1, W]` or `[P, W]`.
    Conv,
    /// `A_log`.
    ALog,
    /// `dt_bias`.
    DtBias,
    /// `f_a_proj`, `g_a_proj`: `[r, D]` (any `r ≥ 1`).
    Down,
    /// `f_b_proj`, `g_b_proj`: `[P, r]` with `r` from the matching down projection.
    Up(usize),
    /// `b_proj`: `[H, D]`.
    Beta,
    /// `o_norm.weight`: `[K]`.
    Norm,
}

/// Layer dimensions from the config.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Hidden size D.
    pub hidden: usize,
    /// Heads H.
    pub heads: usize,
    /// Head dim K.
    pub head_dim: usize,
    /// Conv width W.
    pub conv_width: usize,
}

impl Dims {
    fn p(&self) -> usize {
        self.heads.saturating_mul(self.head_dim)
    }
}

/// Checks `shape` for `role`; returns the number of leading elements to use, or the reason
/// (with the accepted shapes) it is refused.
pub fn accept_shape(role: Role, shape: &[usize], d: &Dims) -> Result<usize, String> {
    let (p, hd, h, k, w) = (d.p(), d.hidden, d.heads, d.head_dim, d.conv_width);
    let ok = |cands: &[Vec<usize>]| -> Result<usize, String> {
        if cands.iter().any(|c| c.as_slice() == shape) {
            Ok(shape.iter().product())
        } else {
            let list: Vec<String> = cands.iter().map(|c| format!("{c:?}")).collect();
            Err(format!(
                "has shape {shape:?}, expected {}",
                list.join(" or ")
            ))
        }
    };
    match role {
        Role::ProjIn => ok(&[vec![p, hd]]),
        Role::ProjOut => ok(&[vec![hd, p]]),
        Role::Conv => ok(&[vec![p, 1, w], vec![p, w]]),
        Role::ALog => match shape {
            [n] if *n >= h => Ok(h),
            [1, 1, n, 1] | [n, 1] if *n == h => Ok(h),
            _ => Err(format!(
                "has shape {shape:?}, expected [{h}], [1, 1, {h}, 1], [{h}, 1] or [n ≥ {h}] (zero-padded)"
            )),
        },
        Role::DtBias => ok(&[vec![p], vec![h, k]]),
        Role::Down => match shape {
            [r, c] if *r >= 1 && *c == hd => Ok(r * c),
            _ => Err(format!("has shape {shape:?}, expected [rank, {hd}]")),
        },
        Role::Up(r) => ok(&[vec![p, r]]),
        Role::Beta => ok(&[vec![h, hd]]),
        Role::Norm => ok(&[vec![k]]),
    }
}

/// Builds a weight from `file` (number `file_id` of the model) and its entry `name`, checking
/// dtype and shape. Used in place when aligned, else copied (said in the debug log).
pub fn load_tensor(
    file: &SafetensorsFile,
    file_id: usize,
    name: &str,
    role: Role,
    dims: &Dims,
) -> Result<WeightTensor> {
    let e = file.entry(name)?;
    let dtype = FloatDtype::from_dtype(e.dtype).ok_or_else(|| {
        let quant = matches!(
            e.dtype,
            safetensors::Dtype::U8
                | safetensors::Dtype::I8
                | safetensors::Dtype::I32
                | safetensors::Dtype::F8_E4M3
                | safetensors::Dtype::F8_E5M2
                | safetensors::Dtype::F4
        );
        if quant {
            HostError::Unsupported {
                file: file.name.clone(),
                tensor: name.to_string(),
                reason: format!(
                    "has quantised dtype {:?}, which kda does not read (it reads quantised weights as compressed-tensors `pack-quantized` groups or from GGUF files)",
                    e.dtype
                ),
            }
        } else {
            HostError::tensor(
                &file.name,
                name,
                format!("has dtype {:?}, expected F32, BF16 or F16", e.dtype),
            )
        }
    })?;
    let used =
        accept_shape(role, &e.shape, dims).map_err(|r| HostError::tensor(&file.name, name, r))?;
    let start = e.range.start;
    let range = start..start + used * dtype.size();
    let raw = file.buffer.get(range.clone()).unwrap_or(&[]);
    let storage = if view_in_place(raw, dtype).is_some() {
        Storage::InPlace {
            file: file_id,
            range,
        }
    } else {
        crate::log::debug(format_args!(
            "{}: tensor `{name}` ({} bytes {}) is not aligned for in-place use: copied",
            file.name,
            raw.len(),
            dtype.name()
        ));
        Storage::Copied(FloatVec::decode(raw, dtype, || {
            format!(
                "a copy of tensor `{name}` of {} (its bytes are misaligned for in-place use)",
                file.name
            )
        })?)
    };
    Ok(WeightTensor {
        name: name.to_string(),
        dtype,
        shape: e.shape.clone(),
        used,
        storage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let d = Dims {
            hidden: 10,
            heads: 3,
            head_dim: 4,
            conv_width: 4,
        };
        assert_eq!(accept_shape(Role::ALog, &[3], &d), Ok(3));
        assert_eq!(accept_shape(Role::ALog, &[1, 1, 3, 1], &d), Ok(3));
        assert_eq!(accept_shape(Role::ALog, &[3, 1], &d), Ok(3));
        assert_eq!(accept_shape(Role::ALog, &[128], &d), Ok(3));
        assert!(accept_shape(Role::ALog, &[2], &d).is_err());
        assert!(accept_shape(Role::ALog, &[1, 1, 4, 1], &d).is_err());
        assert_eq!(accept_shape(Role::Conv, &[12, 1, 4], &d), Ok(48));
        assert_eq!(accept_shape(Role::Conv, &[12, 4], &d), Ok(48));
        assert!(accept_shape(Role::Conv, &[12, 3], &d).is_err());
        assert_eq!(accept_shape(Role::DtBias, &[3, 4], &d), Ok(12));
        assert_eq!(accept_shape(Role::Down, &[5, 10], &d), Ok(50));
        assert!(accept_shape(Role::Down, &[0, 10], &d).is_err());
        let e = accept_shape(Role::ProjIn, &[10, 12], &d).unwrap_err();
        assert!(e.contains("[10, 12]") && e.contains("[12, 10]"), "{e}");
    }
}
