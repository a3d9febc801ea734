//! int8 quantisation of a layer's weights into caller buffers (`kda_core::quantize_layer`).

use kda_core::{GateWeights, MatRef};

use crate::config::{config, KdaConfig};
use crate::ffi::{get, out_ptr, put, Buffers};
use crate::status::{guard, KdaStatus};
use crate::weights::{tensor_of, KdaTensor, KdaWeights};

/// Caller-owned buffers for `kda_quantize_layer`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaQuantBuffers {
    /// int8 values, at least `weights_len` from `kda_quantized_len`.
    pub data: *mut i8,
    /// Elements at `data`.
    pub data_len: usize,
    /// Row scales, at least `scales_len` from `kda_quantized_len`.
    pub scales: *mut f32,
    /// Floats at `scales`.
    pub scales_len: usize,
    /// Non-zero: quantise the three conv weights too (one scale per channel).
    pub conv: u32,
}

/// Buffer sizes for `kda_quantize_layer`: int8 elements to `*weights_len`, scales to
/// `*scales_len` (`conv` non-zero: the conv weights are quantised too).
///
/// # Safety
/// `cfg`: a valid config; `weights_len`, `scales_len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_quantized_len(
    cfg: *const KdaConfig,
    conv: u32,
    weights_len: *mut usize,
    scales_len: *mut usize,
) -> KdaStatus {
    guard(|| {
        // SAFETY (all): the caller's contract.
        let c = unsafe { config(cfg) }?;
        let n = kda_core::quantized_len(&c, conv != 0)?;
        unsafe { put(weights_len, n.weights) }?;
        unsafe { put(scales_len, n.scales) }
    })
}

fn mat(m: &MatRef<'_>) -> KdaTensor {
    tensor_of(m.data())
}

fn gate(g: &GateWeights<'_>) -> [KdaTensor; 2] {
    match g {
        GateWeights::FullRank(m) => [mat(m), absent(tensor_of(kda_core::Data::F32(&[])))],
        GateWeights::LowRank { down, up } => [mat(down), mat(up)],
    }
}

fn absent(t: KdaTensor) -> KdaTensor {
    KdaTensor {
        data: core::ptr::null(),
        len: 0,
        scales: core::ptr::null(),
        scales_len: 0,
        ..t
    }
}

/// Quantises every matrix of `src` (row-major; any float dtype) to symmetric int8 with one
/// scale per row into `bufs`, and writes to `*out` descriptors of the quantised layer: its
/// matrices (and conv weights with `bufs->conv`) point into `bufs`, the small parameters to
/// `src`'s data. Both must outlive any layer initialised from `*out`.
///
/// # Safety
/// `cfg`, `src`, `bufs`: valid; `out`: writable; every pointer holds as many elements as it
/// says.
#[no_mangle]
pub unsafe extern "C" fn kda_quantize_layer(
    cfg: *const KdaConfig,
    src: *const KdaWeights,
    bufs: *const KdaQuantBuffers,
    out: *mut KdaWeights,
) -> KdaStatus {
    guard(|| {
        // SAFETY (all): the caller's contract; pointers are checked by `get` / `Buffers`.
        let c = unsafe { config(cfg) }?;
        let w = unsafe { get(src) }?;
        let w: kda_core::KdaWeights<'static> = unsafe { w.to_core_dense(&c) }?;
        let qb = unsafe { get(bufs) }?;
        let p = out_ptr(out)?;
        let mut b = Buffers::new();
        let q: &'static mut [i8] = unsafe { b.slice_mut(qb.data, qb.data_len) }?;
        let s: &'static mut [f32] = unsafe { b.slice_mut(qb.scales, qb.scales_len) }?;
        crate::weights::check_weights::<false>(&b, &w)?;
        let r = kda_core::quantize_layer(&c, &w, q, s, qb.conv != 0)?;
        let [decay_proj, decay_up] = gate(&r.decay_proj);
        let [gate_proj, gate_up] = gate(&r.output_gate);
        let opt = |d: Option<kda_core::Data<'_>>| {
            d.map_or(absent(tensor_of(kda_core::Data::F32(&[]))), tensor_of)
        };
        let result = KdaWeights {
            q_proj: mat(&r.q_proj),
            k_proj: mat(&r.k_proj),
            v_proj: mat(&r.v_proj),
            q_conv: tensor_of(r.q_conv),
            k_conv: tensor_of(r.k_conv),
            v_conv: tensor_of(r.v_conv),
            a_log: opt(r.a_log),
            dt_bias: opt(r.dt_bias),
            decay_proj,
            decay_up: if decay_up.len == 0 {
                absent(decay_up)
            } else {
                decay_up
            },
            b_proj: mat(&r.b_proj),
            gate_proj,
            gate_up: if gate_up.len == 0 {
                absent(gate_up)
            } else {
                gate_up
            },
            o_norm: tensor_of(r.o_norm),
            o_proj: mat(&r.o_proj),
        };
        // SAFETY: `out` is non-NULL, aligned and writable (the caller's contract).
        unsafe { p.write(result) };
        Ok(())
    })
}
