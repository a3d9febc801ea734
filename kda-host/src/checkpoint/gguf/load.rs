//! Loading the KDA layers of llama.cpp's `kimi-linear` GGUF files (one file or a split set)
//! into a [`Checkpoint`]: the model configuration from the metadata, each tensor checked
//! against it (names, shapes and transforms from [`super::kimi_names`]) and used in place over
//! the mapped bytes, the quantised matrices as [`Data::Blocks`](kda_core::Data::Blocks). The one
//! copy is `A_log` (H values), recovered from `ssm_a = −exp(A_log)`.
//!
//! Metadata read (keys `kimi-linear.…`): `block_count`, `embedding_length`, `ssm.conv_kernel`,
//! `kda.head_dim`, `attention.layer_norm_rms_epsilon`, and `attention.head_count_kv`, whose 0
//! entries mark the KDA layers (when it is not an array, the KDA layers are those with a
//! `blk.{i}.ssm_a`). The head count is not stored: it is the length of `ssm_a`. A file written
//! by `kda quantize --layers` lists the layers it holds in `kda.layers`; any other file holds
//! every KDA layer. llama.cpp's `kimi-linear` has the softplus decay gate and the low-rank
//! output gate only, so those are the forms loaded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kda_core::quant::BlockFormat;

use super::index::GgufIndex;
use super::kimi_names::{a_log_from_ssm_a, arch_key, KdaTensor, ARCH};
use super::parse::TensorInfo;
use super::split::GgufSet;
use super::types::GgmlType;
use super::value::Metadata;
use super::GgufFile;
use crate::checkpoint::config::{Layout, ModelConfig};
use crate::checkpoint::layout::{
    accept_shape, Dims, GateTensors, LayerTensors, Role, Src, Storage, WeightTensor,
};
use crate::checkpoint::safetensors::{
    view_in_place, Buffer, FloatDtype, FloatVec, SafetensorsFile,
};
use crate::checkpoint::{Checkpoint, Source};
use crate::error::{HostError, Result};
use crate::model::ModelLayer;

/// The most blocks (layers) a model may have: llama.cpp's `LLAMA_MAX_LAYERS` is 512; this
/// bounds the per-layer lists a file's `block_count` sizes.
const MAX_BLOCKS: usize = 4096;

/// The model configuration the metadata and tensors of `set` describe, and the KDA layers it
/// holds.
fn model_config(set: &GgufSet) -> Result<(ModelConfig, Vec<usize>)> {
    let meta = set.metadata();
    let file = set.files()[0].name.as_str();
    let err = |reason: String| HostError::gguf(file, reason);
    let arch = meta.get_str("general.architecture")?;
    if arch != ARCH {
        return Err(err(format!(
            "key `general.architecture` is `{arch}`; kda reads the KDA layers of `{ARCH}` files (Kimi Linear)"
        )));
    }
    let size = |key: &str| -> Result<usize> {
        let k = arch_key(key);
        match meta.get_u32(&k)? {
            0 => Err(err(format!("key `{k}` is 0; it must be positive"))),
            n => usize::try_from(n).map_err(|_| err(format!("key `{k}` is too large"))),
        }
    };
    let blocks = size("block_count")?;
    if blocks > MAX_BLOCKS {
        return Err(err(format!(
            "key `{}` is {blocks}; kda reads models of at most {MAX_BLOCKS} blocks",
            arch_key("block_count")
        )));
    }
    let hidden = size("embedding_length")?;
    let conv_width = size("ssm.conv_kernel")?;
    let head_dim = size("kda.head_dim")?;
    let eps_key = arch_key("attention.layer_norm_rms_epsilon");
    let rms_eps = meta.get_f32(&eps_key)?;
    if !(rms_eps.is_finite() && rms_eps > 0.0) {
        return Err(err(format!(
            "key `{eps_key}` is {rms_eps}; it must be a positive number"
        )));
    }
    let kda_layers = kda_layers(set, &meta, blocks)?;
    let held = held_layers(&meta, &kda_layers, file)?;
    let heads = head_count(set, held[0])?;
    let config = ModelConfig {
        layout: Layout::KimiLinear,
        model_type: Some("kimi_linear".into()),
        hidden,
        num_layers: Some(blocks),
        full_attn_layers: (0..blocks).filter(|l| !kda_layers.contains(l)).collect(),
        kda_layers,
        heads,
        head_dim,
        conv_width,
        rms_eps,
        lower_bound: None,
        full_rank_gate: false,
    };
    config
        .layer_config(1, 1)
        .validate()
        .map_err(|e| err(format!("invalid KDA dimensions: {e}")))?;
    Ok((config, held))
}

/// The KDA layers: the 0 entries of `attention.head_count_kv` when it is an array (one entry
/// per block), else the blocks that have an `ssm_a`.
fn kda_layers(set: &GgufSet, meta: &Metadata, blocks: usize) -> Result<Vec<usize>> {
    let key = arch_key("attention.head_count_kv");
    let file = set.files()[0].name.as_str();
    let layers: Vec<usize> = match meta.get(&key) {
        Some(super::Value::Array(_)) => {
            let kv = meta.get_array_i32(&key)?;
            if kv.len() != blocks {
                return Err(HostError::gguf(
                    file,
                    format!(
                        "key `{key}` has {} entries, but the model has {blocks} blocks",
                        kv.len()
                    ),
                ));
            }
            (0..blocks).filter(|&l| kv[l] == 0).collect()
        }
        _ => (0..blocks)
            .filter(|&l| set.tensor(&KdaTensor::ALog.gguf_name(l)).is_ok())
            .collect(),
    };
    if layers.is_empty() {
        return Err(HostError::gguf(
            file,
            format!("has no KDA layers (no 0 in `{key}`, no `blk.N.ssm_a` tensor)"),
        ));
    }
    Ok(layers)
}

/// The layers the file holds: `kda.layers` when present (each a KDA layer), else all of them.
fn held_layers(meta: &Metadata, kda: &[usize], file: &str) -> Result<Vec<usize>> {
    if !meta.contains("kda.layers") {
        return Ok(kda.to_vec());
    }
    let mut held = Vec::new();
    for l in meta.get_array_u32("kda.layers")? {
        let l = l as usize;
        if kda.binary_search(&l).is_err() {
            return Err(HostError::gguf(
                file,
                format!("key `kda.layers` lists layer {l}, which is not a KDA layer of the model"),
            ));
        }
        held.push(l);
    }
    held.sort_unstable();
    held.dedup();
    if held.is_empty() {
        return Err(HostError::gguf(file, "key `kda.layers` lists no layer"));
    }
    Ok(held)
}

/// The head count: the length of `ssm_a` in layer `layer`.
fn head_count(set: &GgufSet, layer: usize) -> Result<usize> {
    let name = KdaTensor::ALog.gguf_name(layer);
    let (f, info) = set.tensor(&name)?;
    let n = info.ne().iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    match n.and_then(|n| usize::try_from(n).ok()) {
        Some(h) if h > 0 => Ok(h),
        _ => Err(HostError::tensor(
            &f.name,
            name,
            format!("has dims {:?}; it needs one value per head", info.ne()),
        )),
    }
}

/// The shape a GGUF tensor has in the Hugging Face checkpoint (numpy order): `ne` reversed, a
/// matrix's two dims always, a vector's or a conv's with the trailing 1s of `ne` dropped
/// (`ssm_a` `[1, H, 1, 1]` → `[H, 1]`, convs `[W, 1, P, 1]` → `[P, 1, W]`).
fn hf_shape(t: KdaTensor, ne: &[u64]) -> Vec<usize> {
    let keep = if t.is_matrix() {
        ne.len()
    } else {
        ne.len() - ne.iter().rev().take_while(|&&d| d == 1).count()
    };
    // A scalar (no dims) stays empty, which no role accepts.
    ne[..keep.max(1).min(ne.len())]
        .iter()
        .rev()
        .map(|&d| d as usize)
        .collect()
}

/// The float format of a plain GGUF tensor type.
fn float_dtype(t: GgmlType) -> Option<FloatDtype> {
    match t {
        GgmlType::F32 => Some(FloatDtype::F32),
        GgmlType::F16 => Some(FloatDtype::F16),
        GgmlType::BF16 => Some(FloatDtype::Bf16),
        _ => None,
    }
}

/// One tensor being loaded.
struct Tensor<'c> {
    files: &'c [SafetensorsFile],
    file: usize,
    info: &'c TensorInfo,
    kind: KdaTensor,
}

impl Tensor<'_> {
    fn err(&self, reason: impl Into<String>) -> HostError {
        HostError::tensor(&self.files[self.file].name, &self.info.name, reason)
    }

    fn raw(&self) -> &[u8] {
        self.files[self.file]
            .buffer
            .get(self.info.range.clone())
            .unwrap_or_default()
    }

    fn load(&self, role: Role, dims: &Dims) -> Result<WeightTensor> {
        let shape = hf_shape(self.kind, self.info.ne());
        let used = accept_shape(role, &shape, dims)
            .map_err(|r| self.err(format!("{r} (GGUF dims {:?}, ne[0] first)", self.info.ne())))?;
        let ty = self.info.ggml_type;
        if let Some(dtype) = float_dtype(ty) {
            return self.float(dtype, shape, used);
        }
        let format = BlockFormat::from_ggml_type(ty.id()).ok_or_else(|| {
            HostError::Unsupported {
                file: self.files[self.file].name.clone(),
                tensor: self.info.name.clone(),
                reason: format!(
                    "has type {}, which kda does not read (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q2_K–Q6_K)",
                    ty.name()
                ),
            }
        })?;
        if !self.kind.is_matrix() {
            return Err(self.err(format!(
                "has type {}; kda reads this tensor as F32, F16 or BF16 (llama.cpp's converter writes it as F32)",
                ty.name()
            )));
        }
        Ok(WeightTensor {
            name: self.info.name.clone(),
            dtype: FloatDtype::F16,
            shape,
            used,
            storage: Storage::Blocks {
                file: self.file,
                range: self.info.range.clone(),
                format,
            },
        })
    }

    /// A float tensor: in place when aligned (GGUF aligns tensor data to 32 bytes), else
    /// copied; `A_log` is computed from `ssm_a`.
    fn float(&self, dtype: FloatDtype, shape: Vec<usize>, used: usize) -> Result<WeightTensor> {
        let raw = self.raw().get(..used * dtype.size()).unwrap_or_default();
        let what = || format!("a copy of tensor `{}`", self.info.name);
        let (storage, dtype) = if self.kind == KdaTensor::ALog {
            let a_log = self.a_log(FloatVec::decode(raw, dtype, what)?)?;
            (Storage::Copied(FloatVec::F32(a_log)), FloatDtype::F32)
        } else if view_in_place(raw, dtype).is_some() {
            let start = self.info.range.start;
            let range = start..start + raw.len();
            (
                Storage::InPlace {
                    file: self.file,
                    range,
                },
                dtype,
            )
        } else {
            (Storage::Copied(FloatVec::decode(raw, dtype, what)?), dtype)
        };
        Ok(WeightTensor {
            name: self.info.name.clone(),
            dtype,
            shape,
            used,
            storage,
        })
    }

    /// `A_log = ln(−ssm_a)`, refusing values that no `A_log` gives (`ssm_a` must be negative
    /// and finite).
    fn a_log(&self, ssm_a: FloatVec) -> Result<Vec<f32>> {
        let v: Vec<f32> = match ssm_a {
            FloatVec::F32(v) => v,
            FloatVec::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
            FloatVec::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        };
        let mut out = Vec::with_capacity(v.len());
        for (i, &a) in v.iter().enumerate() {
            let l = a_log_from_ssm_a(a);
            if !(a < 0.0 && l.is_finite()) {
                return Err(self.err(format!(
                    "holds {a} at {i}; ssm_a = −exp(A_log) must be negative and finite"
                )));
            }
            out.push(l);
        }
        Ok(out)
    }
}

impl Checkpoint {
    /// Opens the GGUF file at `path`, with the rest of its split set when it is one.
    pub(in crate::checkpoint) fn open_gguf(path: &Path) -> Result<Self> {
        let set = GgufSet::open(path)?;
        let paths = set.files().iter().map(|f| PathBuf::from(&f.name)).collect();
        Self::from_gguf_set(path.display().to_string(), set, Source::Gguf(paths))
    }

    /// A GGUF checkpoint held in memory: the bytes of one file, or of every file of a split
    /// set in order, by name.
    pub fn from_gguf_memory(files: Vec<(String, Vec<u8>)>) -> Result<Self> {
        let name = files
            .first()
            .map_or_else(|| "<memory>".to_string(), |(n, _)| n.clone());
        let files = files
            .into_iter()
            .map(|(n, b)| GgufFile::parse(n, Buffer::Owned(b)))
            .collect::<Result<Vec<_>>>()?;
        let set = GgufSet::from_files(files)?;
        Self::from_gguf_set(name, set, Source::Gguf(Vec::new()))
    }

    fn from_gguf_set(name: String, set: GgufSet, source: Source) -> Result<Self> {
        let (config, held) = model_config(&set)?;
        let index = GgufIndex::new(set.files(), held);
        crate::log::debug(format_args!(
            "{name}: GGUF {ARCH}, {} file(s), {} tensors, hidden {}, KDA layers held {:?}",
            index.files(),
            index.len(),
            config.hidden,
            index.held()
        ));
        let files = set
            .into_files()
            .into_iter()
            .map(|f| SafetensorsFile::bytes_only(f.name, f.buffer))
            .collect();
        Ok(Checkpoint {
            name,
            config,
            source,
            index: None,
            files,
            opened: HashMap::new(),
            quant: None,
            group_specs: Vec::new(),
            gguf: Some(index),
        })
    }

    fn gguf_tensor(
        &self,
        index: &GgufIndex,
        layer: usize,
        kind: KdaTensor,
        role: Role,
        dims: &Dims,
    ) -> Result<WeightTensor> {
        let (file, info) = index.get(&kind.gguf_name(layer))?;
        Tensor {
            files: &self.files,
            file: *file,
            info,
            kind,
        }
        .load(role, dims)
    }

    /// Loads KDA layer `layer` of a GGUF checkpoint (checked to be a KDA layer).
    pub(in crate::checkpoint) fn load_gguf_layer(
        &self,
        index: &GgufIndex,
        layer: usize,
    ) -> Result<ModelLayer> {
        if index.held().binary_search(&layer).is_err() {
            let v: Vec<String> = index.held().iter().map(usize::to_string).collect();
            return Err(HostError::file(
                &self.name,
                format!(
                    "holds only KDA layers {} (key `kda.layers`), not layer {layer}",
                    v.join(",")
                ),
            ));
        }
        let dims = self.dims();
        let t = |kind, role| self.gguf_tensor(index, layer, kind, role, &dims);
        // In the file's order, so that the first error is the first bad tensor.
        let qkv = [
            t(KdaTensor::QProj, Role::ProjIn)?,
            t(KdaTensor::KProj, Role::ProjIn)?,
            t(KdaTensor::VProj, Role::ProjIn)?,
        ];
        let conv = [
            t(KdaTensor::QConv, Role::Conv)?,
            t(KdaTensor::KConv, Role::Conv)?,
            t(KdaTensor::VConv, Role::Conv)?,
        ];
        let a_log = t(KdaTensor::ALog, Role::ALog)?;
        let dt_bias = t(KdaTensor::DtBias, Role::DtBias)?;
        let f_a = t(KdaTensor::FA, Role::Down)?;
        let decay_rank = f_a.shape[0];
        let f_b = t(KdaTensor::FB, Role::Up(decay_rank))?;
        let b_proj = t(KdaTensor::Beta, Role::Beta)?;
        let g_a = t(KdaTensor::GA, Role::Down)?;
        let out_rank = g_a.shape[0];
        let g_b = t(KdaTensor::GB, Role::Up(out_rank))?;
        let tensors = LayerTensors {
            qkv,
            conv,
            a_log,
            dt_bias,
            decay_proj: GateTensors::LowRank(f_a, f_b),
            b_proj,
            output_gate: GateTensors::LowRank(g_a, g_b),
            o_norm: t(KdaTensor::ONorm, Role::Norm)?,
            o_proj: t(KdaTensor::OProj, Role::ProjOut)?,
        };
        let cfg = self.config.layer_config(decay_rank, out_rank);
        // Every tensor was checked on its own; this is the core's check of them together.
        tensors.weights(&cfg, Src::files(&self.files))?;
        Ok(ModelLayer {
            index: layer,
            cfg,
            tensors,
        })
    }
}
