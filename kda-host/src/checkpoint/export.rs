//! Writing checkpoints in the Kimi Linear or Kimi K3 layout from owned layers: for tests,
//! fuzz seeds and synthetic models. The files are what a real checkpoint of that layout holds
//! for its KDA layers (plus one small placeholder tensor per non-KDA layer).

use std::collections::BTreeMap;
use std::path::Path;

use kda_core::{DecayGate, GateProj, KdaConfig};
use safetensors::Dtype;
use serde_json::{json, Value};

use super::config::Layout;
use super::safetensors::{serialize, OutTensor};
use super::{CONFIG_FILE, INDEX_FILE, SINGLE_FILE};
use crate::error::{HostError, Result};
use crate::layer::{OwnedData, OwnedGate, OwnedLayer, OwnedMat};

/// How `A_log` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ALogShape {
    /// `[H]`.
    Flat,
    /// `[1, 1, H, 1]` (Kimi Linear).
    KimiLinear,
    /// `[H, 1]`.
    Column,
    /// `[n]`, zero-padded to `n ≥ H` (Kimi K3 pads 96 heads to 128).
    Padded(usize),
}

/// What to write.
#[derive(Debug, Clone)]
pub struct ExportOptions {
    /// Config and tensor-name layout.
    pub layout: Layout,
    /// `num_hidden_layers`; layers not given as KDA layers are listed as full attention.
    pub num_layers: usize,
    /// Number of weight files: 1 writes `model.safetensors`, more write shards and an index.
    pub shards: usize,
    /// `A_log` storage.
    pub a_log: ALogShape,
    /// Conv weights as `[P, 1, W]` (true, as published) or `[P, W]`.
    pub conv_3d: bool,
}

impl ExportOptions {
    /// The published form of `layout`: Kimi Linear `A_log` `[1,1,H,1]`, Kimi K3 `A_log`
    /// zero-padded to a multiple of 128; conv `[P,1,W]`; one file.
    pub fn published(layout: Layout, num_layers: usize) -> Self {
        ExportOptions {
            layout,
            num_layers,
            shards: 1,
            a_log: match layout {
                Layout::KimiLinear => ALogShape::KimiLinear,
                Layout::KimiK3 => ALogShape::Padded(0),
            },
            conv_3d: true,
        }
    }
}

fn data_tensor(name: String, shape: Vec<usize>, d: &OwnedData) -> OutTensor {
    match d {
        OwnedData::F32(v) => OutTensor::f32(name, shape, v),
        OwnedData::Bf16(v) => OutTensor {
            name,
            dtype: Dtype::BF16,
            shape,
            bytes: v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        },
    }
}

fn mat_tensor(name: String, m: &OwnedMat) -> OutTensor {
    data_tensor(name, vec![m.rows, m.cols], &m.data)
}

fn padded(d: &OwnedData, n: usize) -> OwnedData {
    match d {
        OwnedData::F32(v) => {
            let mut v = v.clone();
            v.resize(n.max(v.len()), 0.0);
            OwnedData::F32(v)
        }
        OwnedData::Bf16(v) => {
            let mut v = v.clone();
            v.resize(n.max(v.len()), half::bf16::ZERO);
            OwnedData::Bf16(v)
        }
    }
}

/// The files of a checkpoint holding `layers` (`(0-based model layer, weights)`), all of one
/// configuration: `(file name, bytes)`, config first.
pub fn export_files(
    layers: &[(usize, &OwnedLayer)],
    opts: &ExportOptions,
) -> Result<Vec<(String, Vec<u8>)>> {
    let Some((_, first)) = layers.first() else {
        return Err(HostError::Invalid("export: no layers given".into()));
    };
    let cfg = first.cfg;
    if layers.iter().any(|(_, l)| l.cfg != cfg) {
        return Err(HostError::Invalid(
            "export: layers differ in configuration".into(),
        ));
    }
    if let Some((i, _)) = layers.iter().find(|(i, _)| *i >= opts.num_layers) {
        return Err(HostError::Invalid(format!(
            "export: layer {i} is past num_layers {}",
            opts.num_layers
        )));
    }
    let kda: Vec<usize> = layers.iter().map(|(i, _)| i + 1).collect();
    let config = config_json(&cfg, &kda, opts);
    let mut tensors = Vec::new();
    for (i, l) in layers {
        layer_tensors(*i, l, opts, &mut tensors)?;
    }
    // A placeholder for every other layer, as a real checkpoint has MLA/MLP tensors there.
    for i in 0..opts.num_layers {
        if !kda.contains(&(i + 1)) {
            let name = format!("{}input_layernorm.weight", opts.layout.layer_prefix(i));
            tensors.push(OutTensor::f32(
                name,
                vec![cfg.hidden],
                &vec![1.0; cfg.hidden],
            ));
        }
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let config =
        serde_json::to_vec_pretty(&config).map_err(|e| HostError::Invalid(e.to_string()))?;
    let mut files = vec![(CONFIG_FILE.to_string(), config)];
    files.extend(weight_files(&tensors, opts.shards)?);
    Ok(files)
}

/// `config.json` for `kda` (1-based KDA layers) in the layout of `opts`.
fn config_json(cfg: &KdaConfig, kda: &[usize], opts: &ExportOptions) -> Value {
    let full: Vec<usize> = (1..=opts.num_layers).filter(|i| !kda.contains(i)).collect();
    let mut lin = json!({
        "num_heads": cfg.heads,
        "head_dim": cfg.head_dim,
        "short_conv_kernel_size": cfg.conv_width,
        "kda_layers": kda,
        "full_attn_layers": full,
    });
    if let DecayGate::LowerBound(lb) = cfg.decay_gate {
        lin["gate_lower_bound"] = json!(lb);
    }
    if cfg.output_gate == GateProj::FullRank {
        lin["use_full_rank_gate"] = json!(true);
    }
    let text = json!({
        "model_type": "kimi_linear",
        "hidden_size": cfg.hidden,
        "num_hidden_layers": opts.num_layers,
        "rms_norm_eps": cfg.rms_eps,
        "linear_attn_config": lin,
    });
    match opts.layout {
        Layout::KimiLinear => {
            let mut t = text;
            t["architectures"] = json!(["KimiLinearForCausalLM"]);
            t
        }
        Layout::KimiK3 => json!({
            "architectures": ["KimiK3ForConditionalGeneration"],
            "model_type": "kimi_k3",
            "text_config": text,
        }),
    }
}

/// Appends the tensors of model layer `i` (0-based) to `tensors`, named and shaped as the
/// layout of `opts` has them.
fn layer_tensors(
    i: usize,
    l: &OwnedLayer,
    opts: &ExportOptions,
    tensors: &mut Vec<OutTensor>,
) -> Result<()> {
    let cfg = &l.cfg;
    let (h, p, w) = (cfg.heads, cfg.proj_dim(), cfg.conv_width);
    let pre = format!("{}self_attn.", opts.layout.layer_prefix(i));
    let n = |s: &str| format!("{pre}{s}");
    for (s, m) in ["q_proj", "k_proj", "v_proj"].iter().zip(&l.qkv) {
        tensors.push(mat_tensor(n(&format!("{s}.weight")), m));
    }
    let conv_shape = if opts.conv_3d {
        vec![p, 1, w]
    } else {
        vec![p, w]
    };
    for (s, c) in ["q_conv1d", "k_conv1d", "v_conv1d"].iter().zip(&l.conv) {
        tensors.push(data_tensor(
            n(&format!("{s}.weight")),
            conv_shape.clone(),
            c,
        ));
    }
    let a = l
        .a_log
        .as_ref()
        .ok_or_else(|| HostError::Invalid("export: the layer has no A_log".into()))?;
    let (a, a_shape) = match opts.a_log {
        ALogShape::Flat => (a.clone(), vec![h]),
        ALogShape::KimiLinear => (a.clone(), vec![1, 1, h, 1]),
        ALogShape::Column => (a.clone(), vec![h, 1]),
        ALogShape::Padded(m) => {
            let m = if m == 0 {
                h.div_ceil(128) * 128
            } else {
                m.max(h)
            };
            (padded(a, m), vec![m])
        }
    };
    tensors.push(data_tensor(n("A_log"), a_shape, &a));
    let dt = l
        .dt_bias
        .as_ref()
        .ok_or_else(|| HostError::Invalid("export: the layer has no dt_bias".into()))?;
    tensors.push(data_tensor(n("dt_bias"), vec![p], dt));
    match &l.decay_proj {
        OwnedGate::LowRank(a, b) => {
            tensors.push(mat_tensor(n("f_a_proj.weight"), a));
            tensors.push(mat_tensor(n("f_b_proj.weight"), b));
        }
        OwnedGate::FullRank(_) => {
            return Err(HostError::Invalid(
                "export: Kimi checkpoints have a low-rank decay projection (f_a/f_b)".into(),
            ))
        }
    }
    tensors.push(mat_tensor(n("b_proj.weight"), &l.b_proj));
    match &l.output_gate {
        OwnedGate::FullRank(g) => tensors.push(mat_tensor(n("g_proj.weight"), g)),
        OwnedGate::LowRank(a, b) => {
            tensors.push(mat_tensor(n("g_a_proj.weight"), a));
            tensors.push(mat_tensor(n("g_b_proj.weight"), b));
        }
    }
    tensors.push(data_tensor(
        n("o_norm.weight"),
        vec![cfg.head_dim],
        &l.o_norm,
    ));
    tensors.push(mat_tensor(n("o_proj.weight"), &l.o_proj));
    Ok(())
}

/// The weight files: one `model.safetensors`, or `shards` shards and their index.
fn weight_files(tensors: &[OutTensor], shards: usize) -> Result<Vec<(String, Vec<u8>)>> {
    let shards = shards.clamp(1, tensors.len().max(1));
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    if shards == 1 {
        return Ok(vec![(
            SINGLE_FILE.to_string(),
            serialize(tensors, &meta, SINGLE_FILE)?,
        )]);
    }
    let mut files = Vec::new();
    let per = tensors.len().div_ceil(shards);
    let mut map = serde_json::Map::new();
    let mut total = 0usize;
    for (k, chunk) in tensors.chunks(per).enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", k + 1, shards);
        for t in chunk {
            map.insert(t.name.clone(), json!(name));
            total += t.bytes.len();
        }
        files.push((name.clone(), serialize(chunk, &meta, &name)?));
    }
    let index = json!({"metadata": {"total_size": total}, "weight_map": map});
    files.push((
        INDEX_FILE.to_string(),
        serde_json::to_vec_pretty(&index).map_err(|e| HostError::Invalid(e.to_string()))?,
    ));
    Ok(files)
}

/// Writes a checkpoint folder (created if needed) holding `layers`; each file is replaced
/// atomically.
pub fn export_dir(dir: &Path, layers: &[(usize, &OwnedLayer)], opts: &ExportOptions) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| HostError::io(dir, e))?;
    for (name, bytes) in export_files(layers, opts)? {
        crate::fsio::write_bytes(&dir.join(name), &bytes)?;
    }
    Ok(())
}
