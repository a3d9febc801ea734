//! compressed-tensors `pack-quantized` checkpoints: the `quantization_config` of
//! `config.json` (which linear layers are quantised, and how) and the loading of their
//! `weight_packed` / `weight_scale` / `weight_shape` / `weight_zero_point` tensors as
//! [`kda_core::quant::Groups`] views over the mapped files.
//!
//! Accepted: `quant_method: "compressed-tensors"`, `format: "pack-quantized"`, config groups
//! whose `weights` are `type: "int"`, `num_bits` 4 or 8, `strategy` `"group"` (any
//! `group_size` that divides the row) or `"channel"`, symmetric or not, no `actorder`, not
//! dynamic. A linear layer is quantised when a group's `targets` match it (`"Linear"`, its
//! full module name, or `re:` + a regular expression matched from the start of the name) and
//! no `ignore` entry does.

pub mod load;
pub mod views;

use regex::Regex;
use serde_json::{Map, Value};

use crate::error::{HostError, Result};

/// How one config group quantises a linear layer's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// Bits per weight: 4 or 8.
    pub bits: u8,
    /// Weights per scale along a row; `None` for the channel strategy (the whole row).
    pub group: Option<usize>,
    /// Symmetric (no zero points).
    pub symmetric: bool,
}

impl Scheme {
    /// Short label, e.g. `int4 g32 sym`.
    pub fn label(&self) -> String {
        let g = self
            .group
            .map_or("channel".to_string(), |g| format!("g{g}"));
        let s = if self.symmetric { "sym" } else { "asym" };
        format!("int{} {g} {s}", self.bits)
    }
}

/// A module-name pattern of `targets` or `ignore`.
#[derive(Debug, Clone)]
enum Pattern {
    /// A class name (`Linear`) or an exact module name.
    Name(String),
    /// `re:` + a regular expression, matched from the start of the module name.
    Re(Regex),
}

impl Pattern {
    fn parse(s: &str, err: &dyn Fn(String) -> HostError) -> Result<Self> {
        match s.strip_prefix("re:") {
            Some(re) => Regex::new(&format!("^(?:{re})"))
                .map(Pattern::Re)
                .map_err(|e| {
                    err(format!(
                        "pattern `{s}` is not a valid regular expression: {e}"
                    ))
                }),
            None => Ok(Pattern::Name(s.to_string())),
        }
    }

    /// Whether this pattern selects the linear layer `module`.
    fn matches_linear(&self, module: &str) -> bool {
        match self {
            Pattern::Name(n) => n == "Linear" || n == module,
            Pattern::Re(r) => r.is_match(module),
        }
    }
}

#[derive(Debug, Clone)]
struct Group {
    name: String,
    targets: Vec<Pattern>,
    scheme: Scheme,
}

/// The parsed `quantization_config` of a compressed-tensors checkpoint.
#[derive(Debug, Clone)]
pub struct CtConfig {
    groups: Vec<Group>,
    ignore: Vec<Pattern>,
}

impl CtConfig {
    /// Reads `quantization_config` from the bytes of `config.json` (`file` names it in
    /// errors): `None` when there is none.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Option<Self>> {
        let err = |reason: String| HostError::Config {
            file: file.to_string(),
            reason,
        };
        let v: Value =
            serde_json::from_slice(bytes).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let Some(q) = v.get("quantization_config").filter(|q| !q.is_null()) else {
            return Ok(None);
        };
        let q = q
            .as_object()
            .ok_or_else(|| err("`quantization_config` is not an object".into()))?;
        let text = |k: &str| q.get(k).and_then(Value::as_str).unwrap_or("");
        if text("quant_method") != "compressed-tensors" {
            return Err(err(format!(
                "`quantization_config.quant_method` is `{}`; only `compressed-tensors` is supported",
                text("quant_method")
            )));
        }
        if text("format") != "pack-quantized" {
            return Err(err(format!(
                "`quantization_config.format` is `{}`; only `pack-quantized` (int4 / int8 groups) is supported",
                text("format")
            )));
        }
        let groups = q
            .get("config_groups")
            .and_then(Value::as_object)
            .ok_or_else(|| err("`quantization_config` lacks the `config_groups` object".into()))?;
        let mut out = Vec::with_capacity(groups.len());
        for (name, g) in groups {
            out.push(parse_group(name, g, &err)?);
        }
        let ignore = match q.get("ignore") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => patterns(v, "quantization_config.ignore", &err)?,
        };
        Ok(Some(CtConfig {
            groups: out,
            ignore,
        }))
    }

    /// The scheme quantising the linear layer `module` (its name without `.weight`), with the
    /// config group's name; `None` when it stays unquantised (ignored or not targeted).
    pub fn scheme_for(&self, module: &str) -> Option<(&str, Scheme)> {
        if self.ignore.iter().any(|p| p.matches_linear(module)) {
            return None;
        }
        self.groups
            .iter()
            .find(|g| g.targets.iter().any(|p| p.matches_linear(module)))
            .map(|g| (g.name.as_str(), g.scheme))
    }
}

fn patterns(v: &Value, what: &str, err: &dyn Fn(String) -> HostError) -> Result<Vec<Pattern>> {
    let list = v
        .as_array()
        .ok_or_else(|| err(format!("`{what}` is not a list of names")))?;
    list.iter()
        .map(|p| {
            let s = p
                .as_str()
                .ok_or_else(|| err(format!("`{what}` holds a non-string entry {p}")))?;
            Pattern::parse(s, err)
        })
        .collect()
}

fn parse_group(name: &str, g: &Value, err: &dyn Fn(String) -> HostError) -> Result<Group> {
    let at = format!("quantization_config.config_groups.{name}");
    let g = g
        .as_object()
        .ok_or_else(|| err(format!("`{at}` is not an object")))?;
    let targets = patterns(
        g.get("targets").unwrap_or(&Value::Null),
        &format!("{at}.targets"),
        err,
    )?;
    let w = g
        .get("weights")
        .and_then(Value::as_object)
        .ok_or_else(|| err(format!("`{at}.weights` is missing or not an object")))?;
    let scheme = parse_weights(w, &format!("{at}.weights"), err)?;
    Ok(Group {
        name: name.to_string(),
        targets,
        scheme,
    })
}

fn parse_weights(
    w: &Map<String, Value>,
    at: &str,
    err: &dyn Fn(String) -> HostError,
) -> Result<Scheme> {
    let field = |k: &str| w.get(k).filter(|v| !v.is_null());
    let text = |k: &str| field(k).map(|v| v.as_str().unwrap_or("?").to_string());
    if let Some(t) = text("type").filter(|t| t != "int") {
        return Err(err(format!(
            "`{at}.type` is `{t}`; only `int` is supported"
        )));
    }
    let bits = field("num_bits").and_then(Value::as_u64);
    let bits = match bits {
        Some(b @ (4 | 8)) => b as u8,
        _ => {
            return Err(err(format!(
                "`{at}.num_bits` is {}; only 4 and 8 are supported",
                field("num_bits").map_or("missing".to_string(), Value::to_string)
            )))
        }
    };
    if field("dynamic").and_then(Value::as_bool) == Some(true) {
        return Err(err(format!(
            "`{at}.dynamic` is true; only static weights are supported"
        )));
    }
    if let Some(a) = field("actorder") {
        return Err(err(format!(
            "`{at}.actorder` is {a}; activation ordering (`g_idx`) is not supported"
        )));
    }
    let symmetric = field("symmetric").and_then(Value::as_bool).unwrap_or(true);
    let group = match text("strategy").as_deref() {
        Some("group") => match field("group_size").and_then(Value::as_u64) {
            Some(g) if g > 0 => Some(
                usize::try_from(g).map_err(|_| err(format!("`{at}.group_size` is too large")))?,
            ),
            _ => {
                return Err(err(format!(
                    "`{at}.group_size` must be a positive integer for the group strategy"
                )))
            }
        },
        Some("channel") => None,
        other => {
            return Err(err(format!(
                "`{at}.strategy` is `{}`; only `group` and `channel` are supported",
                other.unwrap_or("missing")
            )))
        }
    };
    Ok(Scheme {
        bits,
        group,
        symmetric,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(weights: &str, ignore: &str) -> Result<Option<CtConfig>> {
        let s = format!(
            r#"{{"quantization_config": {{"quant_method": "compressed-tensors",
            "format": "pack-quantized", "ignore": {ignore},
            "config_groups": {{"group_0": {{"targets": ["Linear"], "weights": {weights}}}}}}}}}"#
        );
        CtConfig::parse(s.as_bytes(), "config.json")
    }

    const W4: &str = r#"{"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
        "group_size": 32, "actorder": null, "dynamic": false}"#;

    #[test]
    fn targets_and_ignore() {
        let c = cfg(
            W4,
            r#"["lm_head", "re:.*b_proj$", "model.layers.0.self_attn.o_proj"]"#,
        )
        .unwrap()
        .unwrap();
        let (g, s) = c.scheme_for("model.layers.0.self_attn.q_proj").unwrap();
        assert_eq!((g, s.label().as_str()), ("group_0", "int4 g32 sym"));
        assert!(c.scheme_for("model.layers.0.self_attn.b_proj").is_none());
        assert!(c.scheme_for("model.layers.0.self_attn.o_proj").is_none());
        assert!(c.scheme_for("model.layers.1.self_attn.o_proj").is_some());
        assert!(CtConfig::parse(b"{}", "config.json").unwrap().is_none());
    }

    #[test]
    fn refusals_name_the_field() {
        let bad = [
            (
                W4.replace("\"num_bits\": 4", "\"num_bits\": 3"),
                "num_bits` is 3",
            ),
            (
                W4.replace("\"group\"", "\"tensor\""),
                "strategy` is `tensor`",
            ),
            (
                W4.replace("\"actorder\": null", "\"actorder\": \"group\""),
                "actorder",
            ),
            (W4.replace("\"int\"", "\"float\""), "type` is `float`"),
        ];
        for (w, want) in bad {
            let e = cfg(&w, "[]").unwrap_err().to_string();
            assert!(e.starts_with("config.json") && e.contains(want), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        let e = CtConfig::parse(
            br#"{"quantization_config": {"quant_method": "compressed-tensors", "format": "marlin-24"}}"#,
            "config.json",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`marlin-24`"), "{e}");
        let e = cfg(W4, r#"["re:("]"#).unwrap_err().to_string();
        assert!(e.contains("not a valid regular expression"), "{e}");
    }
}
