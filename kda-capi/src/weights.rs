//! Weight descriptors: one [`KdaTensor`] (pointer, length, dtype, layout, scales) per tensor,
//! checked before it becomes a [`Data`] / [`MatRef`] view.

use core::ffi::c_void;

use kda_core::{bf16, f16, Data, GateProj, GateWeights, KdaError, MatRef};

use crate::dtype::{
    KDA_DTYPE_BF16, KDA_DTYPE_F16, KDA_DTYPE_F32, KDA_DTYPE_GGUF_BASE, KDA_DTYPE_GROUPS,
    KDA_DTYPE_I8,
};
use crate::ffi::{weight_slice, Buffers};
use crate::qweights::{blocks, groups_view};
use crate::status::{guard, Fail, Res};
use crate::KdaStatus;

/// `KdaTensor::layout`: row-major `[rows, cols]` (PyTorch `[out, in]`).
pub const KDA_LAYOUT_ROWS: u32 = 0;
/// `KdaTensor::layout`: bf16 panel layout: groups of 16 rows stored column by column, element
/// `(o, k)` at `(o / 16)·16·cols + 16·k + o % 16`, the last group padded with zero rows
/// (`kda_pack_panels` writes it, `kda_panels_len` sizes it). Same results, bitwise, as
/// row-major; faster on the CPU kernels.
pub const KDA_LAYOUT_PANELS: u32 = 1;

/// One tensor, borrowed from the caller. The caller owns `data` and `scales`; they must stay
/// alive and unchanged for as long as a layer handle initialised from them is used.
///
/// A tensor with `len == 0` (and `scales_len == 0`; `data` may then be NULL) is "absent":
/// allowed only for `a_log` and `dt_bias`, and for the `*_up` halves of full-rank gates.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaTensor {
    /// The elements, of type `dtype`, in `layout`.
    pub data: *const c_void,
    /// Number of elements at `data` (for the panel layout: `kda_panels_len(rows, cols)`; for
    /// `KDA_DTYPE_GGUF_BASE + t`: bytes; for `KDA_DTYPE_GROUPS`: `rows · cols`).
    pub len: usize,
    /// `KDA_DTYPE_*`: a float or int8 type, or a quantised matrix format
    /// (`KDA_DTYPE_GGUF_BASE + t`, `KDA_DTYPE_GROUPS`).
    pub dtype: u32,
    /// `KDA_LAYOUT_*` (vectors and conv weights: `KDA_LAYOUT_ROWS`).
    pub layout: u32,
    /// int8 only: row scales (`rows` floats; conv weights: one per channel). NULL otherwise.
    pub scales: *const f32,
    /// Number of floats at `scales` (0 for float dtypes).
    pub scales_len: usize,
}

/// Every weight of one layer (checkpoint names in brackets). Shapes follow the config:
/// `D = heads · head_dim`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaWeights {
    /// `q_proj.weight` `[D, hidden]`.
    pub q_proj: KdaTensor,
    /// `k_proj.weight` `[D, hidden]`.
    pub k_proj: KdaTensor,
    /// `v_proj.weight` `[D, hidden]`.
    pub v_proj: KdaTensor,
    /// `q_conv1d.weight` `[D, W]`; column `W−1` multiplies the current token.
    pub q_conv: KdaTensor,
    /// `k_conv1d.weight` `[D, W]`.
    pub k_conv: KdaTensor,
    /// `v_conv1d.weight` `[D, W]`.
    pub v_conv: KdaTensor,
    /// `A_log` `[heads]`: required by the softplus gate, optional (absent) for the lower bound.
    pub a_log: KdaTensor,
    /// `dt_bias` `[D]`, optional (absent).
    pub dt_bias: KdaTensor,
    /// Decay projection: `f_proj.weight` `[D, hidden]` when `decay_rank` is 0, else
    /// `f_a_proj.weight` `[decay_rank, hidden]`.
    pub decay_proj: KdaTensor,
    /// `f_b_proj.weight` `[D, decay_rank]` (absent when `decay_rank` is 0).
    pub decay_up: KdaTensor,
    /// `b_proj.weight` `[heads, hidden]`.
    pub b_proj: KdaTensor,
    /// Output gate: `g_proj.weight` `[D, hidden]` when `output_gate_rank` is 0, else
    /// `g_a_proj.weight` `[output_gate_rank, hidden]`.
    pub gate_proj: KdaTensor,
    /// `g_b_proj.weight` `[D, output_gate_rank]` (absent when `output_gate_rank` is 0).
    pub gate_up: KdaTensor,
    /// `o_norm.weight` `[head_dim]`.
    pub o_norm: KdaTensor,
    /// `o_proj.weight` `[hidden, D]`.
    pub o_proj: KdaTensor,
}

fn weights_err(arg: &'static str, reason: &'static str) -> KdaError {
    KdaError::Weights { arg, reason }
}

impl KdaTensor {
    fn is_absent(&self) -> bool {
        self.len == 0 && self.scales_len == 0
    }

    /// The elements as a [`Data`] view (layout not looked at).
    ///
    /// # Safety
    /// `data` / `scales` point to `len` / `scales_len` valid elements (or are rejected).
    unsafe fn data<'a>(&self, name: &'static str) -> Res<Data<'a>> {
        if self.data.is_null() {
            return Err(KdaStatus::NullPointer.into());
        }
        if is_quantised(self.dtype) {
            return Err(weights_err(name, "quantised formats are for matrices only").into());
        }
        if self.dtype != KDA_DTYPE_I8 && !(self.scales.is_null() && self.scales_len == 0) {
            return Err(weights_err(name, "scales are for int8 tensors only").into());
        }
        // SAFETY (all arms): the caller's contract; `weight_slice` checks NULL, alignment
        // and size.
        Ok(match self.dtype {
            KDA_DTYPE_F32 => Data::F32(unsafe { weight_slice(self.data.cast::<f32>(), self.len) }?),
            KDA_DTYPE_BF16 => {
                Data::Bf16(unsafe { weight_slice(self.data.cast::<bf16>(), self.len) }?)
            }
            KDA_DTYPE_F16 => Data::F16(unsafe { weight_slice(self.data.cast::<f16>(), self.len) }?),
            KDA_DTYPE_I8 => {
                if self.scales.is_null() {
                    return Err(KdaStatus::NullPointer.into());
                }
                Data::I8 {
                    data: unsafe { weight_slice(self.data.cast::<i8>(), self.len) }?,
                    scales: unsafe { weight_slice(self.scales, self.scales_len) }?,
                }
            }
            _ => return Err(weights_err(name, "unknown KDA_DTYPE_* value").into()),
        })
    }

    /// A vector / conv weight (row-major only).
    ///
    /// # Safety
    /// As [`KdaTensor::data`].
    unsafe fn vector<'a>(&self, name: &'static str) -> Res<Data<'a>> {
        if self.layout != KDA_LAYOUT_ROWS {
            return Err(weights_err(name, "vectors and conv weights are row-major").into());
        }
        // SAFETY: forwarded contract.
        unsafe { self.data(name) }
    }

    /// An optional vector: `None` when absent.
    ///
    /// # Safety
    /// As [`KdaTensor::data`].
    unsafe fn optional<'a>(&self, name: &'static str) -> Res<Option<Data<'a>>> {
        if self.is_absent() {
            return Ok(None);
        }
        // SAFETY: forwarded contract.
        unsafe { self.vector(name) }.map(Some)
    }

    /// A matrix `[rows, cols]` in its layout; the quantised formats only when `Q` (a const,
    /// so that builds whose entry points never accept them do not link their decoders).
    ///
    /// # Safety
    /// As [`KdaTensor::data`].
    unsafe fn matrix<'a, const Q: bool>(
        &self,
        name: &'static str,
        rows: usize,
        cols: usize,
    ) -> Res<MatRef<'a>> {
        if is_quantised(self.dtype) {
            if !Q {
                return Err(weights_err(
                    name,
                    "quantised matrices are for the float path (kda_layer_init) only",
                )
                .into());
            }
            if self.layout != KDA_LAYOUT_ROWS {
                return Err(weights_err(name, "quantised matrices are row-major").into());
            }
            // SAFETY: forwarded contract.
            let d = unsafe { quantised(self, name, rows, cols) }?;
            return Ok(MatRef::new(name, d, rows, cols)?);
        }
        // SAFETY: forwarded contract.
        let d = unsafe { self.data(name) }?;
        Ok(match self.layout {
            KDA_LAYOUT_ROWS => MatRef::new(name, d, rows, cols)?,
            KDA_LAYOUT_PANELS => MatRef::new_panels(name, d, rows, cols)?,
            _ => return Err(weights_err(name, "unknown KDA_LAYOUT_* value").into()),
        })
    }
}

/// A gate projection of `form` from its two descriptors.
///
/// # Safety
/// As [`KdaTensor::data`], for both.
unsafe fn gate<'a, const Q: bool>(
    form: GateProj,
    [first, up]: [&KdaTensor; 2],
    names: [&'static str; 3],
    hidden: usize,
    d: usize,
) -> Res<GateWeights<'a>> {
    // SAFETY (both arms): forwarded contract.
    Ok(match form {
        GateProj::FullRank => {
            if !up.is_absent() {
                return Err(weights_err(names[2], "given for a full-rank (rank 0) gate").into());
            }
            GateWeights::FullRank(unsafe { first.matrix::<Q>(names[0], d, hidden) }?)
        }
        GateProj::LowRank { rank } => GateWeights::LowRank {
            down: unsafe { first.matrix::<Q>(names[1], rank, hidden) }?,
            up: unsafe { up.matrix::<Q>(names[2], d, rank) }?,
        },
    })
}

impl KdaWeights {
    /// The core's weight views for `cfg` (a validated config), every descriptor checked.
    ///
    /// # Safety
    /// Every descriptor's pointers point to as many valid elements as its lengths say (or are
    /// rejected), alive and unchanged for `'a`.
    pub(crate) unsafe fn to_core<'a>(
        self,
        cfg: &kda_core::KdaConfig,
    ) -> Res<kda_core::KdaWeights<'a>> {
        // SAFETY: forwarded contract.
        unsafe { self.views::<true>(cfg) }
    }

    /// [`KdaWeights::to_core`] refusing the quantised matrix formats (the integer path and
    /// the int8 quantiser read dense matrices only).
    ///
    /// # Safety
    /// As [`KdaWeights::to_core`].
    pub(crate) unsafe fn to_core_dense<'a>(
        self,
        cfg: &kda_core::KdaConfig,
    ) -> Res<kda_core::KdaWeights<'a>> {
        // SAFETY: forwarded contract.
        unsafe { self.views::<false>(cfg) }
    }

    /// # Safety
    /// As [`KdaWeights::to_core`].
    unsafe fn views<'a, const Q: bool>(
        self,
        cfg: &kda_core::KdaConfig,
    ) -> Res<kda_core::KdaWeights<'a>> {
        let (hd, d, h) = (cfg.hidden, cfg.proj_dim(), cfg.heads);
        // SAFETY (every call): forwarded contract.
        let w = unsafe {
            kda_core::KdaWeights {
                q_proj: self.q_proj.matrix::<Q>("q_proj.weight", d, hd)?,
                k_proj: self.k_proj.matrix::<Q>("k_proj.weight", d, hd)?,
                v_proj: self.v_proj.matrix::<Q>("v_proj.weight", d, hd)?,
                q_conv: self.q_conv.vector("q_conv1d.weight")?,
                k_conv: self.k_conv.vector("k_conv1d.weight")?,
                v_conv: self.v_conv.vector("v_conv1d.weight")?,
                a_log: self.a_log.optional("A_log")?,
                dt_bias: self.dt_bias.optional("dt_bias")?,
                decay_proj: gate::<Q>(
                    cfg.decay_proj,
                    [&self.decay_proj, &self.decay_up],
                    ["f_proj.weight", "f_a_proj.weight", "f_b_proj.weight"],
                    hd,
                    d,
                )?,
                b_proj: self.b_proj.matrix::<Q>("b_proj.weight", h, hd)?,
                output_gate: gate::<Q>(
                    cfg.output_gate,
                    [&self.gate_proj, &self.gate_up],
                    ["g_proj.weight", "g_a_proj.weight", "g_b_proj.weight"],
                    hd,
                    d,
                )?,
                o_norm: self.o_norm.vector("o_norm.weight")?,
                o_proj: self.o_proj.matrix::<Q>("o_proj.weight", hd, d)?,
            }
        };
        w.validate(cfg)?;
        Ok(w)
    }
}

/// Whether `dtype` is one of the quantised matrix formats.
fn is_quantised(dtype: u32) -> bool {
    dtype == KDA_DTYPE_GROUPS || dtype >= KDA_DTYPE_GGUF_BASE
}

/// The view of a quantised matrix descriptor `[rows, cols]`.
///
/// # Safety
/// `t.data` points to the blocks (`t.len` bytes) or to an initialised
/// [`crate::qweights::KdaGroups`], alive and unchanged for `'a`.
unsafe fn quantised<'a>(
    t: &KdaTensor,
    name: &'static str,
    rows: usize,
    cols: usize,
) -> Res<Data<'a>> {
    if !t.scales.is_null() || t.scales_len != 0 {
        return Err(weights_err(
            name,
            "quantised formats carry their scales inside (scales must be NULL)",
        )
        .into());
    }
    let elems = rows
        .checked_mul(cols)
        .ok_or(Fail::from(KdaStatus::Overflow))?;
    if t.dtype == KDA_DTYPE_GROUPS {
        // SAFETY: the caller's contract.
        let g = unsafe { groups_view(t.data) }?;
        if g.rows() != rows || g.cols() != cols || t.len != elems {
            return Err(KdaError::Length {
                arg: name,
                expected: elems,
                actual: g.rows().saturating_mul(g.cols()),
            }
            .into());
        }
        return Ok(Data::Groups(g.all_rows()));
    }
    // SAFETY: the caller's contract.
    unsafe {
        blocks(
            t.data,
            t.len,
            t.dtype.wrapping_sub(KDA_DTYPE_GGUF_BASE),
            name,
            elems,
        )
    }
}

/// Checks that no writable buffer registered in `b` overlaps the layer's weight data; the
/// group-quantised matrices' tensors too when `Q` (views from [`KdaWeights::to_core_dense`]
/// have none, and the integer firmware then links no code for them).
pub(crate) fn check_weights<const Q: bool>(b: &Buffers, w: &kda_core::KdaWeights<'_>) -> Res {
    let data = |b: &Buffers, d: Data<'_>| match d {
        Data::F32(s) => b.check_not_written(s),
        Data::Bf16(s) => b.check_not_written(s),
        Data::F16(s) => b.check_not_written(s),
        Data::I8 { data, scales } => {
            b.check_not_written(data)?;
            b.check_not_written(scales)
        }
        Data::Blocks(q) => b.check_not_written(q.bytes()),
        Data::Groups(_) if !Q => Ok(()),
        Data::Groups(g) => {
            let m = g.matrix();
            b.check_not_written(m.packed())?;
            b.check_not_written(m.zeros().unwrap_or(&[]))?;
            match m.scales() {
                kda_core::quant::Scales::F32(s) => b.check_not_written(s),
                kda_core::quant::Scales::Bf16(s) => b.check_not_written(s),
                kda_core::quant::Scales::F16(s) => b.check_not_written(s),
            }
        }
    };
    let gate = |b: &Buffers, g: &GateWeights<'_>| match g {
        GateWeights::FullRank(m) => data(b, m.data()),
        GateWeights::LowRank { down, up } => {
            data(b, down.data())?;
            data(b, up.data())
        }
    };
    for m in [&w.q_proj, &w.k_proj, &w.v_proj, &w.b_proj, &w.o_proj] {
        data(b, m.data())?;
    }
    gate(b, &w.decay_proj)?;
    gate(b, &w.output_gate)?;
    for d in [w.q_conv, w.k_conv, w.v_conv, w.o_norm] {
        data(b, d)?;
    }
    for d in [w.a_log, w.dt_bias].into_iter().flatten() {
        data(b, d)?;
    }
    Ok(())
}

/// A descriptor viewing `d` (row-major).
pub(crate) fn tensor_of(d: Data<'_>) -> KdaTensor {
    let (data, len, dtype, scales, scales_len): (*const c_void, _, _, *const f32, _) = match d {
        Data::F32(s) => (
            s.as_ptr().cast(),
            s.len(),
            KDA_DTYPE_F32,
            core::ptr::null(),
            0,
        ),
        Data::Bf16(s) => (
            s.as_ptr().cast(),
            s.len(),
            KDA_DTYPE_BF16,
            core::ptr::null(),
            0,
        ),
        Data::F16(s) => (
            s.as_ptr().cast(),
            s.len(),
            KDA_DTYPE_F16,
            core::ptr::null(),
            0,
        ),
        Data::I8 { data, scales } => (
            data.as_ptr().cast(),
            data.len(),
            KDA_DTYPE_I8,
            scales.as_ptr(),
            scales.len(),
        ),
        // Only the int8 quantiser's outputs are described back to C (`kda_quantize_layer`):
        // they are never block or group formats.
        Data::Blocks(_) | Data::Groups(_) => {
            (core::ptr::null(), 0, KDA_DTYPE_F32, core::ptr::null(), 0)
        }
    };
    KdaTensor {
        data,
        len,
        dtype,
        layout: KDA_LAYOUT_ROWS,
        scales,
        scales_len,
    }
}

/// bf16 elements of a `[rows, cols]` matrix in the panel layout, written to `*len`.
///
/// # Safety
/// `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_panels_len(rows: usize, cols: usize, len: *mut usize) -> KdaStatus {
    guard(|| {
        let n = kda_core::panels_len(rows, cols).ok_or(Fail::from(KdaStatus::Overflow))?;
        // SAFETY: the caller's contract.
        unsafe { crate::ffi::put(len, n) }
    })
}

/// Repacks a row-major bf16 matrix `src` (`rows · cols` elements) into the panel layout in
/// `dst` (exactly `kda_panels_len(rows, cols)` elements; the caller owns both).
///
/// # Safety
/// `src` / `dst`: `src_len` / `dst_len` valid elements.
#[no_mangle]
pub unsafe extern "C" fn kda_pack_panels(
    src: *const u16,
    src_len: usize,
    rows: usize,
    cols: usize,
    dst: *mut u16,
    dst_len: usize,
) -> KdaStatus {
    guard(|| {
        let mut b = Buffers::new();
        // SAFETY: the caller's contract; bf16 is a transparent u16.
        let s = unsafe { b.slice(src.cast::<bf16>(), src_len) }?;
        // SAFETY: as above.
        let d = unsafe { b.slice_mut(dst.cast::<bf16>(), dst_len) }?;
        let m = MatRef::new("pack_panels src", Data::Bf16(s), rows, cols)?;
        Ok(kda_core::pack_panels(&m, d)?)
    })
}
