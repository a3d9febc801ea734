//! The metadata of a `kda quantize` file: the keys llama.cpp's converter writes for a Kimi
//! Linear model that `config.json` determines for the KDA layers, with the converter's value
//! types (`conversion/kimi_linear.py` and the base `TextModel.set_gguf_parameters`).
//!
//! Always written: `general.architecture` (`kimi-linear`), `general.type`, `general.name`,
//! `general.file_type`, `general.quantization_version` (2), and `kimi-linear.`
//! `block_count`, `embedding_length`, `attention.head_count`, `attention.head_count_kv` (an
//! INT32 array: 0 for a KDA layer, 1 for an MLA layer, the converter's MQA form),
//! `attention.layer_norm_rms_epsilon`, `ssm.conv_kernel`, `kda.head_dim`. Written when
//! `config.json` has the fields, as the converter derives them: `context_length`,
//! `feed_forward_length`, `vocab_size`, `rope.freq_base`, and the MLA / MoE keys llama.cpp's
//! kimi-linear loader reads (`attention.key_length(_mla)`, `value_length(_mla)`,
//! `kv_lora_rank`, `rope.dimension_count`, `expert_*`, `leading_dense_block_count`), so that
//! llama.cpp's tools accept the file (llama-quantize re-quantises it).
//! `kda.layers` (UINT32 array, 0-based) lists the layers the file holds, which may be a subset
//! (`--layers`): the MLA, MLP and embedding tensors are not written, so llama.cpp's loader
//! accepts the file but cannot run it as a model.

use serde_json::{Map, Value as Json};

use crate::checkpoint::config::ModelConfig;
use crate::checkpoint::gguf::kimi_names::{arch_key, ARCH};
use crate::checkpoint::gguf::{ArrayBuf, GgufWriter};
use crate::error::{HostError, Result};

/// `v` as a u32 value of key `key`, or an error naming both.
fn to_u32(v: usize, key: &str) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| HostError::Invalid(format!("GGUF key `{key}`: {v} does not fit a UINT32")))
}

/// Owned values of the metadata, in the order written (the writer borrows arrays).
#[derive(Debug)]
pub struct Meta {
    name: String,
    file_type: u32,
    blocks: u32,
    hidden: u32,
    conv: u32,
    head_dim: u32,
    head_count: u32,
    head_count_kv: ArrayBuf,
    layers: ArrayBuf,
    optional: Vec<(String, Opt)>,
}

#[derive(Debug, Clone, Copy)]
enum Opt {
    U32(u32),
    F32(f32),
}

/// The keys the converter derives from config.json fields, when those are present:
/// `(GGUF key suffix, config.json fields, summed)`. The MLA and MoE ones are what llama.cpp's
/// kimi-linear loader reads (so llama.cpp tools such as llama-quantize accept the file).
const FROM_CONFIG: [(&str, &[&str]); 15] = [
    ("context_length", &["max_position_embeddings"]),
    ("feed_forward_length", &["intermediate_size"]),
    ("vocab_size", &["vocab_size"]),
    ("expert_count", &["num_experts"]),
    ("expert_used_count", &["num_experts_per_token"]),
    ("expert_group_used_count", &["topk_group"]),
    (
        "attention.key_length",
        &["kv_lora_rank", "qk_rope_head_dim"],
    ),
    ("attention.value_length", &["head_dim"]),
    ("attention.kv_lora_rank", &["kv_lora_rank"]),
    ("rope.dimension_count", &["qk_rope_head_dim"]),
    (
        "attention.key_length_mla",
        &["qk_nope_head_dim", "qk_rope_head_dim"],
    ),
    ("attention.value_length_mla", &["v_head_dim"]),
    ("expert_feed_forward_length", &["moe_intermediate_size"]),
    ("expert_shared_count", &["num_shared_experts"]),
    ("leading_dense_block_count", &["first_k_dense_replace"]),
];

/// The optional keys `text` determines ([`FROM_CONFIG`], `rope.freq_base`,
/// `expert_weights_scale`, `expert_gating_func`).
fn optional_keys(text: &Map<String, Json>) -> Vec<(String, Opt)> {
    let mut v = Vec::new();
    for (key, fields) in FROM_CONFIG {
        let sum = fields
            .iter()
            .map(|f| u32_field(text, f))
            .try_fold(0u32, |acc, x| x.and_then(|x| acc.checked_add(x)));
        if let Some(n) = sum {
            v.push((arch_key(key), Opt::U32(n)));
        }
    }
    for (key, field) in [
        ("rope.freq_base", "rope_theta"),
        ("expert_weights_scale", "routed_scaling_factor"),
    ] {
        if let Some(x) = text.get(field).and_then(Json::as_f64) {
            v.push((arch_key(key), Opt::F32(x as f32)));
        }
    }
    // gguf-py's ExpertGatingFuncType: SOFTMAX 1, SIGMOID 2.
    let gating = match text
        .get("moe_router_activation_func")
        .and_then(Json::as_str)
    {
        Some("softmax") => Some(1),
        Some("sigmoid") => Some(2),
        _ => None,
    };
    if let Some(g) = gating {
        v.push((arch_key("expert_gating_func"), Opt::U32(g)));
    }
    v
}

/// A non-negative integer field of `text` that fits u32.
fn u32_field(text: &Map<String, Json>, key: &str) -> Option<u32> {
    text.get(key)?.as_u64().and_then(|v| u32::try_from(v).ok())
}

impl Meta {
    /// The metadata of a file holding `layers` (0-based) of the model with `cfg` and the text
    /// config object `text` (the flat config.json of Kimi Linear), named `name`.
    pub fn new(
        cfg: &ModelConfig,
        text: &Map<String, Json>,
        name: &str,
        file_type: u32,
        layers: &[usize],
    ) -> Result<Meta> {
        let last = cfg.kda_layers.iter().chain(&cfg.full_attn_layers).max();
        let blocks = cfg.num_layers.unwrap_or(last.map_or(0, |l| l + 1));
        let kv: Vec<i32> = (0..blocks).map(|l| i32::from(!cfg.is_kda(l))).collect();
        let heads = to_u32(cfg.heads, "attention.head_count")?;
        let head_count = u32_field(text, "num_attention_heads").unwrap_or(heads);
        let optional = optional_keys(text);
        let layers = layers
            .iter()
            .map(|&l| to_u32(l, "kda.layers"))
            .collect::<Result<Vec<u32>>>()?;
        Ok(Meta {
            name: name.to_string(),
            file_type,
            blocks: to_u32(blocks, "block_count")?,
            hidden: to_u32(cfg.hidden, "embedding_length")?,
            conv: to_u32(cfg.conv_width, "ssm.conv_kernel")?,
            head_dim: to_u32(cfg.head_dim, "kda.head_dim")?,
            head_count,
            head_count_kv: ArrayBuf::of(&kv),
            layers: ArrayBuf::of(&layers),
            optional,
        })
    }

    /// Adds the keys to `w`.
    pub fn add_to<'a>(&'a self, w: &mut GgufWriter<'a>, rms_eps: f32) -> Result<()> {
        w.add("general.architecture", ARCH)?;
        w.add("general.type", "model")?;
        w.add("general.name", self.name.as_str())?;
        w.add(&arch_key("block_count"), self.blocks)?;
        w.add(&arch_key("embedding_length"), self.hidden)?;
        w.add(&arch_key("attention.head_count"), self.head_count)?;
        w.add(
            &arch_key("attention.head_count_kv"),
            self.head_count_kv.value(),
        )?;
        w.add(&arch_key("attention.layer_norm_rms_epsilon"), rms_eps)?;
        for (key, v) in &self.optional {
            match *v {
                Opt::U32(x) => w.add(key, x)?,
                Opt::F32(x) => w.add(key, x)?,
            }
        }
        w.add(&arch_key("ssm.conv_kernel"), self.conv)?;
        w.add(&arch_key("kda.head_dim"), self.head_dim)?;
        w.add("general.file_type", self.file_type)?;
        w.add("general.quantization_version", 2u32)?;
        w.add("kda.layers", self.layers.value())?;
        Ok(())
    }
}
