//! `config.json` of a Kimi Linear or Kimi K3 checkpoint: the fields the KDA layers need.
//!
//! * Kimi Linear: a flat config (`model_type: kimi_linear`), tensors under `model.layers.{i}.`.
//! * Kimi K3: a VLM wrapper whose text model sits in `text_config`; tensors under
//!   `language_model.model.layers.{i}.`.
//!
//! Both keep the KDA shape in `linear_attn_config` (`num_heads`, `head_dim`,
//! `short_conv_kernel_size`, `kda_layers`, `full_attn_layers`, and for K3 `gate_lower_bound`
//! and `use_full_rank_gate`). The layer lists are **1-based**; everything this crate exposes is
//! 0-based.

use kda_core::{DecayGate, GateProj, KdaConfig};
use serde_json::{Map, Value};

use crate::error::{HostError, Result};

/// Which of the two published checkpoint layouts a config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Flat config; tensors `model.layers.{i}.self_attn.*`.
    KimiLinear,
    /// `text_config` inside a VLM wrapper; tensors `language_model.model.layers.{i}.self_attn.*`.
    KimiK3,
}

impl Layout {
    /// Prefix of the tensors of model layer `layer` (0-based), without `self_attn.`.
    pub fn layer_prefix(self, layer: usize) -> String {
        match self {
            Layout::KimiLinear => format!("model.layers.{layer}."),
            Layout::KimiK3 => format!("language_model.model.layers.{layer}."),
        }
    }

    /// Short human name.
    pub fn name(self) -> &'static str {
        match self {
            Layout::KimiLinear => "Kimi Linear (flat config, model.layers.*)",
            Layout::KimiK3 => "Kimi K3 (text_config, language_model.model.layers.*)",
        }
    }
}

/// The model-level facts the KDA loader needs, read from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Layout (and so the tensor-name prefix).
    pub layout: Layout,
    /// `model_type` of the text model, if given.
    pub model_type: Option<String>,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_hidden_layers`, if given.
    pub num_layers: Option<usize>,
    /// KDA layers, **0-based**, ascending.
    pub kda_layers: Vec<usize>,
    /// Full-attention (MLA) layers, 0-based, ascending.
    pub full_attn_layers: Vec<usize>,
    /// `linear_attn_config.num_heads`.
    pub heads: usize,
    /// `linear_attn_config.head_dim`.
    pub head_dim: usize,
    /// `linear_attn_config.short_conv_kernel_size`.
    pub conv_width: usize,
    /// `rms_norm_eps`.
    pub rms_eps: f32,
    /// `gate_lower_bound` (absent or null: the softplus gate).
    pub lower_bound: Option<f32>,
    /// `use_full_rank_gate` (absent: false, the low-rank `g_a`/`g_b` output gate).
    pub full_rank_gate: bool,
}

/// The top-level JSON object of `bytes`.
fn json_object(bytes: &[u8], file: &str) -> Result<Map<String, Value>> {
    let top: Value = serde_json::from_slice(bytes).map_err(|e| HostError::Config {
        file: file.to_string(),
        reason: format!("not valid JSON: {e}"),
    })?;
    match top {
        Value::Object(top) => Ok(top),
        _ => Err(HostError::Config {
            file: file.to_string(),
            reason: "not a JSON object".into(),
        }),
    }
}

struct Ctx<'a> {
    file: &'a str,
    /// `""` or `"text_config."`, for messages.
    scope: &'static str,
}

impl Ctx<'_> {
    fn err(&self, reason: String) -> HostError {
        HostError::Config {
            file: self.file.to_string(),
            reason,
        }
    }

    /// `linear_attn_config`, which a config with KDA layers must have.
    fn linear_attn_config<'v>(
        &self,
        text: &'v Map<String, Value>,
    ) -> Result<&'v Map<String, Value>> {
        let scope = self.scope;
        match text.get("linear_attn_config") {
            Some(Value::Object(l)) => Ok(l),
            Some(Value::Null) | None => Err(self.err(format!(
                "lacks `{scope}linear_attn_config` (not a Kimi Linear / Kimi K3 config with KDA layers)"
            ))),
            Some(v) => Err(self.err(format!(
                "`{scope}linear_attn_config` must be an object, found {}",
                short(v)
            ))),
        }
    }

    /// The layer lists must name layers that exist, each in one list only.
    fn check_layer_lists(
        &self,
        num_layers: Option<usize>,
        kda_layers: &[usize],
        full_attn_layers: &[usize],
    ) -> Result<()> {
        let scope = self.scope;
        if let Some(n) = num_layers {
            for (key, list) in [
                ("kda_layers", kda_layers),
                ("full_attn_layers", full_attn_layers),
            ] {
                if let Some(&bad) = list.iter().find(|&&i| i >= n) {
                    return Err(self.err(format!(
                        "`{scope}linear_attn_config.{key}` holds {} but `{scope}num_hidden_layers` is {n}",
                        bad + 1
                    )));
                }
            }
        }
        if let Some(&both) = kda_layers.iter().find(|i| full_attn_layers.contains(i)) {
            return Err(self.err(format!(
                "layer {} (1-based) is in both `kda_layers` and `full_attn_layers`",
                both + 1
            )));
        }
        Ok(())
    }

    /// `rms_norm_eps`: required, a non-negative number.
    fn rms_eps(&self, text: &Map<String, Value>) -> Result<f32> {
        let scope = self.scope;
        match text.get("rms_norm_eps") {
            Some(v) => v
                .as_f64()
                .filter(|e| e.is_finite() && *e >= 0.0 && (*e as f32).is_finite())
                .map(|e| e as f32)
                .ok_or_else(|| {
                    self.err(format!(
                        "`{scope}rms_norm_eps` must be a non-negative number, found {}",
                        short(v)
                    ))
                }),
            None => Err(self.err(format!("lacks `{scope}rms_norm_eps`"))),
        }
    }

    /// `(gate_lower_bound, use_full_rank_gate)`: K3 keeps them in `linear_attn_config`; they
    /// are accepted one level up too.
    fn gate_settings(
        &self,
        lin: &Map<String, Value>,
        text: &Map<String, Value>,
    ) -> Result<(Option<f32>, bool)> {
        let pick = |key: &str| lin.get(key).or_else(|| text.get(key));
        let lower_bound = match pick("gate_lower_bound") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_f64()
                    .map(|b| b as f32)
                    .filter(|b| b.is_finite() && *b < 0.0)
                    .ok_or_else(|| {
                        self.err(format!(
                            "`gate_lower_bound` must be a finite negative number, found {}",
                            short(v)
                        ))
                    })?,
            ),
        };
        let full_rank_gate = match pick("use_full_rank_gate") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(self.err(format!(
                    "`use_full_rank_gate` must be true or false, found {}",
                    short(v)
                )))
            }
        };
        Ok((lower_bound, full_rank_gate))
    }

    fn usize_field(
        &self,
        obj: &Map<String, Value>,
        key: &str,
        within: &str,
    ) -> Result<Option<usize>> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    self.err(format!(
                        "`{}{within}{key}` must be a non-negative integer, found {}",
                        self.scope,
                        short(v)
                    ))
                }),
        }
    }

    fn positive(&self, obj: &Map<String, Value>, key: &str, within: &str) -> Result<usize> {
        match self.usize_field(obj, key, within)? {
            Some(0) => Err(self.err(format!("`{}{within}{key}` must be at least 1", self.scope))),
            Some(n) => Ok(n),
            None => Err(self.err(format!("lacks `{}{within}{key}`", self.scope))),
        }
    }

    fn layer_list(
        &self,
        obj: &Map<String, Value>,
        key: &str,
        required: bool,
    ) -> Result<Vec<usize>> {
        let what = format!("{}linear_attn_config.{key}", self.scope);
        let arr = match obj.get(key) {
            None | Some(Value::Null) if !required => return Ok(Vec::new()),
            None | Some(Value::Null) => return Err(self.err(format!("lacks `{what}`"))),
            Some(Value::Array(a)) => a,
            Some(v) => {
                return Err(self.err(format!(
                    "`{what}` must be a list of layer numbers, found {}",
                    short(v)
                )))
            }
        };
        let mut out = Vec::with_capacity(arr.len());
        for v in arr {
            let n = v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    self.err(format!("`{what}` holds {}, not a layer number", short(v)))
                })?;
            if n == 0 {
                return Err(self.err(format!("`{what}` holds 0, but the layer lists are 1-based")));
            }
            out.push(n - 1);
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

/// A JSON value abbreviated for a message.
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 40 {
        format!("{}…", s.chars().take(40).collect::<String>())
    } else {
        s
    }
}

impl ModelConfig {
    /// Parses the bytes of `config.json`; `file` names it in errors.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Self> {
        let top = json_object(bytes, file)?;
        let (text, layout, scope) = match top.get("text_config") {
            Some(Value::Object(t)) => (t, Layout::KimiK3, "text_config."),
            Some(Value::Null) | None => (&top, Layout::KimiLinear, ""),
            Some(v) => {
                return Err(HostError::Config {
                    file: file.to_string(),
                    reason: format!("`text_config` must be an object, found {}", short(v)),
                })
            }
        };
        let c = Ctx { file, scope };
        let lin = c.linear_attn_config(text)?;
        let num_layers = c.usize_field(text, "num_hidden_layers", "")?;
        let kda_layers = c.layer_list(lin, "kda_layers", true)?;
        let full_attn_layers = c.layer_list(lin, "full_attn_layers", false)?;
        c.check_layer_lists(num_layers, &kda_layers, &full_attn_layers)?;
        let (lower_bound, full_rank_gate) = c.gate_settings(lin, text)?;
        let cfg = ModelConfig {
            layout,
            model_type: text
                .get("model_type")
                .and_then(Value::as_str)
                .map(str::to_string),
            hidden: c.positive(text, "hidden_size", "")?,
            num_layers,
            kda_layers,
            full_attn_layers,
            heads: c.positive(lin, "num_heads", "linear_attn_config.")?,
            head_dim: c.positive(lin, "head_dim", "linear_attn_config.")?,
            conv_width: c.positive(lin, "short_conv_kernel_size", "linear_attn_config.")?,
            rms_eps: c.rms_eps(text)?,
            lower_bound,
            full_rank_gate,
        };
        // The dims must make a valid layer (sizes that fit usize, …).
        cfg.layer_config(1, 1)
            .validate()
            .map_err(|e| c.err(format!("invalid KDA dimensions: {e}")))?;
        Ok(cfg)
    }

    /// True when model layer `layer` (0-based) is a KDA layer.
    pub fn is_kda(&self, layer: usize) -> bool {
        self.kda_layers.binary_search(&layer).is_ok()
    }

    /// `Ok` when `layer` (0-based) is a KDA layer, else an error saying what it is.
    pub fn check_kda_layer(&self, layer: usize) -> Result<()> {
        if self.is_kda(layer) {
            return Ok(());
        }
        let what = if self.full_attn_layers.binary_search(&layer).is_ok() {
            "it is a full-attention (MLA) layer".to_string()
        } else if self.num_layers.is_some_and(|n| layer >= n) {
            format!("the model has {} layers", self.num_layers.unwrap_or(0))
        } else {
            "it is not in `kda_layers`".to_string()
        };
        Err(HostError::NotKda {
            layer,
            reason: format!("{what}; KDA layers (0-based): {}", self.kda_list()),
        })
    }

    /// The KDA layers as a compact 0-based list for messages.
    pub fn kda_list(&self) -> String {
        let v: Vec<String> = self.kda_layers.iter().map(usize::to_string).collect();
        if v.len() > 12 {
            format!(
                "{} … {} ({} layers)",
                v[..6].join(","),
                v[v.len() - 3..].join(","),
                v.len()
            )
        } else {
            v.join(",")
        }
    }

    /// The decay gate the config asks for.
    pub fn decay_gate(&self) -> DecayGate {
        match self.lower_bound {
            Some(lb) => DecayGate::LowerBound(lb),
            None => DecayGate::Softplus,
        }
    }

    /// The core configuration of one KDA layer, given the ranks read from the tensors
    /// (`f_a_proj` rows, and `g_a_proj` rows for a low-rank output gate).
    pub fn layer_config(&self, decay_rank: usize, output_rank: usize) -> KdaConfig {
        KdaConfig {
            hidden: self.hidden,
            heads: self.heads,
            head_dim: self.head_dim,
            conv_width: self.conv_width,
            decay_gate: self.decay_gate(),
            decay_proj: GateProj::LowRank { rank: decay_rank },
            output_gate: if self.full_rank_gate {
                GateProj::FullRank
            } else {
                GateProj::LowRank { rank: output_rank }
            },
            rms_eps: self.rms_eps,
            l2_eps: 1e-6,
            scale: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINEAR: &str = r#"{"model_type":"kimi_linear","hidden_size":2304,"num_hidden_layers":27,
        "rms_norm_eps":1e-5,"linear_attn_config":{"full_attn_layers":[4,8,12,16,20,24,27],
        "kda_layers":[1,2,3,5,6,7,9,10,11,13,14,15,17,18,19,21,22,23,25,26],"num_heads":32,
        "head_dim":128,"short_conv_kernel_size":4}}"#;

    #[test]
    fn kimi_linear_config() {
        let c = ModelConfig::parse(LINEAR.as_bytes(), "config.json").unwrap();
        assert_eq!(c.layout, Layout::KimiLinear);
        assert_eq!(c.kda_layers.len(), 20);
        assert_eq!(c.full_attn_layers, vec![3, 7, 11, 15, 19, 23, 26]);
        assert!(c.is_kda(0) && !c.is_kda(3));
        assert_eq!(c.decay_gate(), DecayGate::Softplus);
        assert!(!c.full_rank_gate);
        let e = c.check_kda_layer(3).unwrap_err().to_string();
        assert!(e.contains("layer 3") && e.contains("full-attention"), "{e}");
        assert!(c
            .check_kda_layer(99)
            .unwrap_err()
            .to_string()
            .contains("27 layers"));
    }

    #[test]
    fn kimi_k3_config() {
        let kda: Vec<String> = (1..=91).step_by(2).map(|i| i.to_string()).collect();
        let s = format!(
            r#"{{"model_type":"kimi_k3","text_config":{{"model_type":"kimi_linear","hidden_size":7168,
            "num_hidden_layers":93,"rms_norm_eps":1e-5,"linear_attn_config":{{"head_dim":128,
            "num_heads":96,"short_conv_kernel_size":4,"gate_lower_bound":-5.0,"use_full_rank_gate":true,
            "kda_layers":[{}],"full_attn_layers":[4,8,93]}}}}}}"#,
            kda.join(",")
        );
        let c = ModelConfig::parse(s.as_bytes(), "config.json").unwrap();
        assert_eq!(c.layout, Layout::KimiK3);
        assert_eq!(c.decay_gate(), DecayGate::LowerBound(-5.0));
        assert!(c.full_rank_gate);
        assert_eq!(c.kda_layers[0], 0);
        assert_eq!(c.layer_config(128, 0).output_gate, GateProj::FullRank);
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases: &[(&str, &str)] = &[
            ("not json", "not valid JSON"),
            ("[1]", "not a JSON object"),
            (r#"{"hidden_size":4}"#, "linear_attn_config"),
            (
                r#"{"text_config":{"hidden_size":4}}"#,
                "text_config.linear_attn_config",
            ),
            (
                r#"{"hidden_size":4,"rms_norm_eps":1e-5,"linear_attn_config":{"num_heads":1,"head_dim":2,"short_conv_kernel_size":4}}"#,
                "kda_layers",
            ),
            (
                r#"{"hidden_size":4,"rms_norm_eps":1e-5,"linear_attn_config":{"num_heads":1,"head_dim":2,"short_conv_kernel_size":4,"kda_layers":[0]}}"#,
                "1-based",
            ),
            (
                r#"{"hidden_size":-4,"rms_norm_eps":1e-5,"linear_attn_config":{"num_heads":1,"head_dim":2,"short_conv_kernel_size":4,"kda_layers":[1]}}"#,
                "hidden_size",
            ),
            (
                r#"{"hidden_size":4,"linear_attn_config":{"num_heads":1,"head_dim":2,"short_conv_kernel_size":4,"kda_layers":[1]}}"#,
                "rms_norm_eps",
            ),
            (
                r#"{"hidden_size":4,"rms_norm_eps":1e-5,"linear_attn_config":{"num_heads":1,"head_dim":2,"short_conv_kernel_size":4,"kda_layers":[1],"gate_lower_bound":3}}"#,
                "gate_lower_bound",
            ),
            (
                r#"{"hidden_size":4,"rms_norm_eps":1e-5,"linear_attn_config":{"num_heads":4294967296,"head_dim":4294967296,"short_conv_kernel_size":4,"kda_layers":[1]}}"#,
                "invalid KDA dimensions",
            ),
        ];
        for (json, want) in cases {
            let e = ModelConfig::parse(json.as_bytes(), "dir/config.json")
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("dir/config.json: "), "{e}");
            assert!(e.contains(want), "{json}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
