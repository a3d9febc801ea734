//! Loading one `pack-quantized` matrix: finding its tensors, checking them against each other,
//! against `weight_shape` and against the layer's dimensions, and recording where they are.

use std::ops::Range;

use kda_core::quant::GroupFormat;
use safetensors::Dtype;

use super::super::layout::{accept_shape, Dims, Role, Storage, WeightTensor};
use super::super::safetensors::{view_in_place, FloatDtype, FloatVec, SafetensorsFile};
use super::super::Checkpoint;
use super::views::{vec_dtype, GroupSpec, ScaleStore};
use super::Scheme;
use crate::error::{HostError, Result};

/// The file numbers holding a quantised module's tensors.
struct Found {
    packed: usize,
    scale: usize,
    shape: usize,
    zeros: Option<usize>,
}

/// One quantised module being loaded.
struct Module<'c> {
    files: &'c [SafetensorsFile],
    name: &'c str,
    scheme: Scheme,
    at: Found,
}

impl Module<'_> {
    fn file(&self, id: usize) -> &SafetensorsFile {
        &self.files[id]
    }

    fn err(&self, id: usize, suffix: &str, reason: impl Into<String>) -> HostError {
        HostError::tensor(
            &self.file(id).name,
            format!("{}.{suffix}", self.name),
            reason,
        )
    }

    /// `weight_shape`: `[rows, cols]` as I64 or I32 values.
    fn logical_shape(&self) -> Result<[usize; 2]> {
        let id = self.at.shape;
        let e = self
            .file(id)
            .entry(&format!("{}.weight_shape", self.name))?;
        let size = match e.dtype {
            Dtype::I64 => 8,
            Dtype::I32 => 4,
            d => {
                return Err(self.err(
                    id,
                    "weight_shape",
                    format!("has dtype {d:?}, expected I64 or I32"),
                ))
            }
        };
        if e.shape != [2] {
            return Err(self.err(
                id,
                "weight_shape",
                format!("has shape {:?}, expected [2] (rows, cols)", e.shape),
            ));
        }
        let raw = self.file(id).bytes(e);
        let mut dims = [0usize; 2];
        for (d, c) in dims.iter_mut().zip(raw.chunks_exact(size)) {
            let v = if size == 8 {
                i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))
            } else {
                i64::from(i32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
            };
            *d = usize::try_from(v)
                .map_err(|_| self.err(id, "weight_shape", format!("holds {v}, not a size")))?;
        }
        Ok(dims)
    }

    /// `weight_packed`: I32 `[rows, ⌈cols·bits/32⌉]`.
    fn packed(&self, f: GroupFormat, rows: usize, cols: usize) -> Result<Range<usize>> {
        let id = self.at.packed;
        let e = self
            .file(id)
            .entry(&format!("{}.weight_packed", self.name))?;
        if e.dtype != Dtype::I32 {
            return Err(self.err(
                id,
                "weight_packed",
                format!("has dtype {:?}, expected I32", e.dtype),
            ));
        }
        let words = f
            .row_words(cols)
            .ok_or_else(|| self.err(id, "weight_packed", "size overflows"))?;
        if e.shape != [rows, words] {
            let short = e.shape.len() == 2 && e.shape[0] == rows && e.shape[1] < words;
            return Err(self.err(
                id,
                "weight_packed",
                format!(
                    "has shape {:?}, expected [{rows}, {words}] ({cols} {}-bit quants a row, from weight_shape){}",
                    e.shape,
                    f.bits,
                    if short { ": too short" } else { "" }
                ),
            ));
        }
        Ok(e.range.clone())
    }

    /// `weight_scale`: a float `[rows, cols / group]`.
    fn scales(&self, rows: usize, groups: usize) -> Result<ScaleStore> {
        let id = self.at.scale;
        let name = format!("{}.weight_scale", self.name);
        let e = self.file(id).entry(&name)?;
        let dt = FloatDtype::from_dtype(e.dtype).ok_or_else(|| {
            self.err(
                id,
                "weight_scale",
                format!("has dtype {:?}, expected F32, BF16 or F16", e.dtype),
            )
        })?;
        if e.shape != [rows, groups] {
            return Err(self.err(
                id,
                "weight_scale",
                format!(
                    "has shape {:?}, expected [{rows}, {groups}] (one scale per {} of a row)",
                    e.shape,
                    self.scheme
                        .group
                        .map_or("whole row".to_string(), |g| format!("{g} weights")),
                ),
            ));
        }
        let raw = self.file(id).bytes(e);
        if view_in_place(raw, dt).is_some() {
            return Ok(ScaleStore::InPlace(e.range.clone(), dt));
        }
        Ok(ScaleStore::Copied(FloatVec::decode(raw, dt, || {
            format!("a copy of tensor `{name}` of {}", self.file(id).name)
        })?))
    }

    /// `weight_zero_point`: I32 `[⌈rows·bits/32⌉, cols / group]`, for the asymmetric form.
    fn zeros(&self, f: GroupFormat, rows: usize, groups: usize) -> Result<Option<Range<usize>>> {
        let Some(id) = self.at.zeros else {
            if self.scheme.symmetric {
                return Ok(None);
            }
            return Err(HostError::MissingTensor {
                file: self.file(self.at.packed).name.clone(),
                tensor: format!("{}.weight_zero_point", self.name),
                note: " (the config group is asymmetric)".into(),
            });
        };
        let e = self
            .file(id)
            .entry(&format!("{}.weight_zero_point", self.name))?;
        if self.scheme.symmetric {
            return Err(self.err(
                id,
                "weight_zero_point",
                "is present but the config group is symmetric",
            ));
        }
        let zrows = rows.saturating_mul(f.bits as usize).div_ceil(32);
        if e.dtype != Dtype::I32 || e.shape != [zrows, groups] {
            return Err(self.err(
                id,
                "weight_zero_point",
                format!(
                    "is {:?} {:?}, expected I32 [{zrows}, {groups}] (packed along the rows)",
                    e.dtype, e.shape
                ),
            ));
        }
        Ok(Some(e.range.clone()))
    }

    fn load(&self, role: Role, dims: &Dims, slot: usize) -> Result<WeightTensor> {
        let [rows, cols] = self.logical_shape()?;
        accept_shape(role, &[rows, cols], dims)
            .map_err(|r| self.err(self.at.shape, "weight_shape", format!("says {r}")))?;
        let group = self.scheme.group.unwrap_or(cols);
        if group == 0 || !cols.is_multiple_of(group) {
            return Err(self.err(
                self.at.scale,
                "weight_scale",
                format!("group size {group} does not divide the row of {cols} weights"),
            ));
        }
        let format = GroupFormat {
            bits: self.scheme.bits,
            group,
        };
        let spec = GroupSpec {
            slot,
            format,
            rows,
            cols,
            packed: (self.at.packed, self.packed(format, rows, cols)?),
            scales: (self.at.scale, self.scales(rows, cols / group)?),
            zeros: self
                .zeros(format, rows, cols / group)?
                .map(|r| (self.at.zeros.unwrap_or(0), r)),
            module: self.name.to_string(),
        };
        Ok(WeightTensor {
            name: format!("{}.weight_packed", self.name),
            dtype: match &spec.scales.1 {
                ScaleStore::InPlace(_, d) => *d,
                ScaleStore::Copied(v) => vec_dtype(v),
            },
            shape: vec![rows, cols],
            used: rows * cols,
            storage: Storage::Groups(Box::new(spec)),
        })
    }
}

impl Checkpoint {
    /// Loads the matrix `suffix` (`….weight`) of the layer with tensor prefixes `prefixes`
    /// as `pack-quantized` groups when the checkpoint's `quantization_config` quantises it:
    /// `Ok(None)` when it does not (the matrix is then a plain float tensor).
    pub(in crate::checkpoint) fn quantised_matrix(
        &mut self,
        prefixes: &[String],
        suffix: &str,
        role: Role,
        dims: &Dims,
    ) -> Result<Option<WeightTensor>> {
        let (Some(q), Some(base)) = (&self.quant, suffix.strip_suffix(".weight")) else {
            return Ok(None);
        };
        let schemes: Vec<(String, Option<Scheme>)> = prefixes
            .iter()
            .map(|p| {
                let module = format!("{p}{base}");
                let s = q.scheme_for(&module).map(|(_, s)| s);
                (module, s)
            })
            .collect();
        let mut chosen = None;
        for (module, s) in schemes {
            if let Some(s) = s {
                if self.find(&format!("{module}.weight_packed"))?.is_some() {
                    chosen = Some((module, s));
                    break;
                }
            }
        }
        let Some((module, scheme)) = chosen else {
            return self.unquantised(prefixes, base).map(|()| None);
        };
        let mut need = |t: &str| -> Result<usize> {
            let name = format!("{module}.{t}");
            self.find(&name)?.ok_or_else(|| HostError::MissingTensor {
                file: self.missing_in(),
                tensor: name,
                note:
                    " (a pack-quantized matrix needs weight_packed, weight_scale and weight_shape)"
                        .into(),
            })
        };
        let at = Found {
            packed: need("weight_packed")?,
            scale: need("weight_scale")?,
            shape: need("weight_shape")?,
            zeros: self.find(&format!("{module}.weight_zero_point"))?,
        };
        let slot = self.group_specs.len();
        let m = Module {
            files: &self.files,
            name: &module,
            scheme,
            at,
        };
        let t = m.load(role, dims, slot)?;
        if let Storage::Groups(spec) = &t.storage {
            self.group_specs.push((**spec).clone());
        }
        Ok(Some(t))
    }

    /// A matrix the config leaves unquantised must not be stored quantised.
    fn unquantised(&mut self, prefixes: &[String], base: &str) -> Result<()> {
        for p in prefixes {
            let packed = format!("{p}{base}.weight_packed");
            if self.find(&format!("{p}{base}.weight"))?.is_none() && self.find(&packed)?.is_some() {
                return Err(HostError::tensor(
                    self.missing_in(),
                    packed,
                    "is quantised, but no config group of `quantization_config` targets it (or `ignore` lists it)",
                ));
            }
        }
        Ok(())
    }
}
