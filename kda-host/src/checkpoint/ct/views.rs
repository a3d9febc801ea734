//! Where a `pack-quantized` matrix lives in the weight files ([`GroupSpec`]) and the
//! [`Groups`] views the core reads over them ([`GroupViews`]).

use std::ops::Range;

use kda_core::quant::{GroupFormat, GroupTensors, Groups, Scales};
use kda_core::Data;

use super::super::safetensors::{view_in_place, FloatDtype, FloatVec, SafetensorsFile};
use crate::error::{HostError, Result};

/// The scales of a quantised matrix: in place (aligned) or copied.
#[derive(Debug, Clone, PartialEq)]
pub enum ScaleStore {
    /// This byte range of the matrix's file, of `dtype`.
    InPlace(Range<usize>, FloatDtype),
    /// Copied out (misaligned for their dtype).
    Copied(FloatVec),
}

/// One `pack-quantized` matrix `[rows, cols]`: where its tensors are in the model's files, all checked against each other and against `weight_shape` when it was loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSpec {
    /// Its number among the model's quantised matrices (its place in [`GroupViews`]).
    pub slot: usize,
    /// Bits and group size.
    pub format: GroupFormat,
    /// Rows (output features).
    pub rows: usize,
    /// Weights per row (input features).
    pub cols: usize,
    /// `weight_packed`: file number and bytes.
    pub packed: (usize, Range<usize>),
    /// `weight_scale`: file number and values.
    pub scales: (usize, ScaleStore),
    /// `weight_zero_point` (asymmetric form): file number and bytes.
    pub zeros: Option<(usize, Range<usize>)>,
    /// The module's name (`….q_proj`), for messages.
    pub module: String,
}

impl GroupSpec {
    /// Bytes stored for the matrix (packed quants, scales, zero points).
    pub fn stored_bytes(&self) -> usize {
        let scales = match &self.scales.1 {
            ScaleStore::InPlace(r, _) => r.len(),
            ScaleStore::Copied(v) => v.view().len() * vec_dtype(v).size(),
        };
        self.packed.1.len() + scales + self.zeros.as_ref().map_or(0, |z| z.1.len())
    }

    /// The checked core view over `files`.
    fn view<'a>(&'a self, files: &'a [SafetensorsFile]) -> Result<Groups<'a>> {
        let internal = || {
            HostError::Invalid(format!(
                "internal: quantised matrix `{}` is no longer addressable",
                self.module
            ))
        };
        let bytes = |(f, r): &(usize, Range<usize>)| {
            let f = files.get(*f).ok_or_else(internal)?;
            f.buffer.get(r.clone()).ok_or_else(internal)
        };
        let scales = match &self.scales.1 {
            ScaleStore::InPlace(r, dt) => {
                view_in_place(bytes(&(self.scales.0, r.clone()))?, *dt).ok_or_else(internal)?
            }
            ScaleStore::Copied(v) => v.view(),
        };
        let scales = match scales {
            Data::F32(s) => Scales::F32(s),
            Data::Bf16(s) => Scales::Bf16(s),
            Data::F16(s) => Scales::F16(s),
            _ => return Err(internal()),
        };
        let t = GroupTensors {
            packed: bytes(&self.packed)?,
            scales,
            zeros: self.zeros.as_ref().map(bytes).transpose()?,
        };
        Groups::new("weight_packed", self.format, t, self.rows, self.cols).map_err(|e| {
            let file = files.get(self.packed.0).map_or("", |f| f.name.as_str());
            HostError::tensor(
                file,
                format!("{}.weight_packed", self.module),
                e.to_string(),
            )
        })
    }
}

/// The dtype of a copied vector.
pub fn vec_dtype(v: &FloatVec) -> FloatDtype {
    match v {
        FloatVec::F32(_) => FloatDtype::F32,
        FloatVec::Bf16(_) => FloatDtype::Bf16,
        FloatVec::F16(_) => FloatDtype::F16,
    }
}

/// The [`Groups`] views of a model's quantised matrices, in slot order. The core's weight
/// views ([`kda_core::Data::Groups`]) borrow them.
#[derive(Debug, Default)]
pub struct GroupViews<'a> {
    views: Vec<Groups<'a>>,
}

impl GroupViews<'static> {
    /// No views.
    pub const EMPTY: GroupViews<'static> = GroupViews { views: Vec::new() };
}

impl<'a> GroupViews<'a> {
    /// Views every spec (`specs[i].slot == i`) over `files`.
    pub fn build(files: &'a [SafetensorsFile], specs: &'a [GroupSpec]) -> Result<Self> {
        let mut views = Vec::with_capacity(specs.len());
        for (i, s) in specs.iter().enumerate() {
            if s.slot != i {
                return Err(HostError::Invalid(format!(
                    "internal: quantised matrix `{}` is in slot {i}, not {}",
                    s.module, s.slot
                )));
            }
            views.push(s.view(files)?);
        }
        Ok(GroupViews { views })
    }

    /// The view of `spec`.
    pub fn get(&self, spec: &GroupSpec) -> Result<&Groups<'a>> {
        self.views.get(spec.slot).ok_or_else(|| {
            HostError::Invalid(format!(
                "internal: quantised matrix `{}` has no view",
                spec.module
            ))
        })
    }
}

/// A model's quantised matrices: their specs and the views over the model's files, kept
/// beside those files by [`crate::model::Model`].
#[derive(Debug, Default)]
pub struct OwnedGroups {
    // Declared first, dropped first: the views borrow the specs' copied scales and the files.
    views: GroupViews<'static>,
    specs: Vec<GroupSpec>,
}

impl OwnedGroups {
    /// Views `specs` over `files`.
    ///
    /// # Safety
    /// The files' buffers (memory maps or heap vectors, whose addresses do not change when
    /// the files are moved) must stay alive and unchanged for as long as the result is, and
    /// the owner of both must hand out the views only through borrows of itself.
    #[allow(unsafe_code)]
    pub unsafe fn new(files: &[SafetensorsFile], specs: Vec<GroupSpec>) -> Result<Self> {
        let views = GroupViews::build(files, &specs)?;
        // SAFETY: the views borrow the files' buffers (kept alive by the caller's contract)
        // and the heap buffers of the specs' copied scales, which `specs` owns and never
        // changes; moving `specs` into `self` moves no heap buffer. `GroupViews<'_>` and
        // `GroupViews<'static>` differ in the lifetime alone, and [`OwnedGroups::views`]
        // shortens it back to a borrow of `self`.
        let views = unsafe { std::mem::transmute::<GroupViews<'_>, GroupViews<'static>>(views) };
        Ok(OwnedGroups { views, specs })
    }

    /// The views, for as long as `self` is borrowed.
    pub fn views(&self) -> &GroupViews<'_> {
        &self.views
    }

    /// Number of quantised matrices.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }
}
