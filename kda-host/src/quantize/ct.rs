//! `kda quantize --type int4-g32`: the KDA layers as a compressed-tensors `pack-quantized`
//! checkpoint folder (int4, groups of 32, symmetric, bf16 scales: Kimi K2-Thinking's scheme).
//!
//! OUT is a folder holding `config.json` (the source's, with the `quantization_config`
//! compressed-tensors writes for the scheme) and `model.safetensors` with the KDA layers'
//! tensors under their checkpoint names: each of the eight projections as `weight_packed`
//! (I32), `weight_scale` (BF16) and `weight_shape` (I64), quantised by kda-core's
//! [`quantize_groups`] (bit for bit compressed-tensors' `calculate_qparams` + `compress` on
//! the f32-widened weights); the convs, `A_log`, `dt_bias` and `o_norm` as stored. Only the
//! KDA layers are written, as for the GGUF output; kda reads the folder as it reads any
//! checkpoint. Both files are staged and renamed together once complete, so an error leaves
//! an existing OUT's files untouched. The quantised tensors are held in memory until written
//! (about 0.6 bytes per weight).

use std::collections::BTreeMap;
use std::path::Path;

use half::bf16;
use kda_core::quant::{quantize_groups, GroupFormat, GroupsOut, ScalesMut};
use kda_core::Data;
use safetensors::Dtype;
use serde_json::{json, Map, Value as Json};

use crate::checkpoint::layout::WeightTensor;
use crate::checkpoint::safetensors::{stage_tensors, OutTensor};
use crate::checkpoint::{CONFIG_FILE, SINGLE_FILE};
use crate::error::{HostError, Result};
use crate::fsio;
use crate::model::Model;

/// The scheme written: int4, groups of 32, symmetric.
pub const FORMAT: GroupFormat = GroupFormat { bits: 4, group: 32 };

/// The `quantization_config` compressed-tensors writes for [`FORMAT`] with bf16 scales.
pub fn quantization_config() -> Json {
    json!({
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": FORMAT.bits,
                    "type": "int",
                    "symmetric": true,
                    "strategy": "group",
                    "group_size": FORMAT.group,
                    "actorder": null,
                    "dynamic": false,
                    "observer": "minmax",
                    "scale_dtype": "bfloat16",
                },
                "input_activations": null,
                "output_activations": null,
                "format": "pack-quantized",
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": null,
    })
}

/// One written tensor: `(name, type name, weights, bytes written, bytes in the checkpoint)`.
pub type Written = (String, &'static str, usize, u64, usize);

/// The stored tensors of one quantised `[rows, cols]` matrix called `name` (`….weight`).
fn pack(name: &str, d: &Data<'_>, rows: usize, cols: usize) -> Result<Vec<OutTensor>> {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    if !cols.is_multiple_of(FORMAT.group) {
        return Err(HostError::Invalid(format!(
            "tensor `{name}`: rows of {cols} are not whole groups of {}",
            FORMAT.group
        )));
    }
    let mut x = vec![0.0f32; rows * cols];
    for (i, v) in x.iter_mut().enumerate() {
        *v = d.get(i).unwrap_or(f32::NAN);
    }
    let words = FORMAT.row_words(cols).unwrap_or(0);
    let mut packed = vec![0u8; rows * words * 4];
    let mut scales = vec![bf16::ZERO; rows * cols / FORMAT.group];
    let out = GroupsOut {
        packed: &mut packed,
        scales: ScalesMut::Bf16(&mut scales),
        zeros: None,
    };
    quantize_groups(&x, (rows, cols), FORMAT, out)
        .map_err(|e| HostError::Invalid(format!("tensor `{name}`: {e}")))?;
    let scale_bytes = scales
        .iter()
        .flat_map(|s| s.to_bits().to_le_bytes())
        .collect();
    Ok(vec![
        OutTensor {
            name: format!("{base}.weight_packed"),
            dtype: Dtype::I32,
            shape: vec![rows, words],
            bytes: packed,
        },
        OutTensor {
            name: format!("{base}.weight_scale"),
            dtype: Dtype::BF16,
            shape: vec![rows, cols / FORMAT.group],
            bytes: scale_bytes,
        },
        OutTensor::i64(format!("{base}.weight_shape"), &[rows as i64, cols as i64]),
    ])
}

/// A tensor copied as stored (its dtype and shape).
fn copy(t: &WeightTensor, d: &Data<'_>) -> OutTensor {
    let (dtype, bytes): (Dtype, Vec<u8>) = match d {
        Data::Bf16(v) => (
            Dtype::BF16,
            v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        ),
        Data::F16(v) => (
            Dtype::F16,
            v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect(),
        ),
        _ => {
            let v: Vec<f32> = (0..d.len()).map(|i| d.get(i).unwrap_or(f32::NAN)).collect();
            (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect())
        }
    };
    // A zero-padded A_log keeps only the used heads.
    let shape = if t.used == t.shape.iter().product::<usize>() {
        t.shape.clone()
    } else {
        vec![t.used]
    };
    OutTensor {
        name: t.name.clone(),
        dtype,
        shape,
        bytes,
    }
}

/// The source config with `quantization_config` set (at the top level, where compressed-tensors
/// and the loaders look).
fn config_json(mut top: Map<String, Json>) -> Result<Vec<u8>> {
    top.insert("quantization_config".into(), quantization_config());
    serde_json::to_vec_pretty(&Json::Object(top)).map_err(|e| HostError::Invalid(e.to_string()))
}

/// Writes the folder `out` for the layers of `model`; `top` is the source config.json.
pub fn write_folder(model: &Model, top: Map<String, Json>, out: &Path) -> Result<Vec<Written>> {
    let mut tensors = Vec::new();
    let mut written = Vec::new();
    for layer in model.layers() {
        for t in layer.tensors.all() {
            let d = t.data(model.files())?;
            if let [rows, cols] = t.shape[..] {
                if t.name.ends_with("_proj.weight") {
                    let p = pack(&t.name, &d, rows, cols)?;
                    let bytes = p.iter().map(|o| o.bytes.len() as u64).sum();
                    written.push((t.name.clone(), "int4-g32", rows * cols, bytes, t.bytes()));
                    tensors.extend(p);
                    continue;
                }
            }
            let c = copy(t, &d);
            written.push((
                t.name.clone(),
                dtype_name(c.dtype),
                t.used,
                c.bytes.len() as u64,
                t.bytes(),
            ));
            tensors.push(c);
        }
    }
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let config = config_json(top)?;
    let created = create_folder(out)?;
    let staged = (|| {
        let c = fsio::stage(&out.join(CONFIG_FILE), |w| w.write_all(&config))?;
        let views = tensors.iter().map(OutTensor::view).collect();
        let t = stage_tensors(&out.join(SINGLE_FILE), views, &BTreeMap::new())?;
        fsio::commit_all(vec![t, c])
    })();
    if staged.is_err() && created {
        // Only a folder this run made, and only when empty.
        let _ = std::fs::remove_dir(out);
    }
    staged.map(|()| written)
}

fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::BF16 => "BF16",
        Dtype::F16 => "F16",
        _ => "F32",
    }
}

/// Creates `out` (a folder) if missing (true: created); refuses a path that is something else.
fn create_folder(out: &Path) -> Result<bool> {
    match std::fs::metadata(out) {
        Ok(md) if md.is_dir() => Ok(false),
        Ok(_) => Err(HostError::file(
            out.display().to_string(),
            "exists and is not a folder (--type int4-g32 writes a checkpoint folder)",
        )),
        Err(_) => std::fs::create_dir(out)
            .map(|()| true)
            .map_err(|e| HostError::io(out, e)),
    }
}
