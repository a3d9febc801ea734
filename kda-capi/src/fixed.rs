//! The integer-only decode path (`kda_core::fixed`): int8 weights, Q15.16 activations and
//! state, no float operation per token.

use core::mem::{align_of, size_of};

use kda_core::fixed::{self, FixedCachesMut, FixedWeights};

use crate::config::{config, KdaConfig};
use crate::ffi::{get, out_ptr, put, Buffers};
use crate::status::{guard, KdaStatus, Res};
use crate::weights::KdaWeights;

/// Size of [`KdaFixedLayer`] in 8-byte words.
pub const KDA_FIXED_LAYER_WORDS: usize = 112;

/// Fractional bits of the integer path's activations (inputs, outputs, conv states): Q15.16,
/// `x_q = round(x · 65536)`.
pub const KDA_Q_ACT_FRAC: u32 = 16;
/// Fractional bits of the integer path's recurrent state: Q15.16.
pub const KDA_Q_STATE_FRAC: u32 = 16;

const _: () = assert!(KDA_Q_ACT_FRAC == fixed::ACT_FRAC && KDA_Q_STATE_FRAC == fixed::STATE_FRAC);

/// A layer prepared for the integer path. Opaque, fixed size, caller-owned like `KdaLayer`;
/// it views the int8 weight data and the parameter buffer given to `kda_fixed_init`, which
/// must both outlive it, unchanged.
#[repr(C)]
#[derive(Debug)]
pub struct KdaFixedLayer {
    /// Opaque.
    pub opaque: [u64; KDA_FIXED_LAYER_WORDS],
}

/// Marks an initialised handle ("KDA-FIXD").
const MAGIC: u64 = 0x4B44_412D_4649_5844;

pub(crate) struct Inner {
    magic: u64,
    cfg: kda_core::KdaConfig,
    /// Byte range of the parameter buffer (read by every step: no call may write it).
    params: (usize, usize),
    weights: FixedWeights<'static>,
}

const _: () = assert!(size_of::<Inner>() <= size_of::<KdaFixedLayer>());
const _: () = assert!(align_of::<Inner>() <= align_of::<KdaFixedLayer>());

/// `N` sequences' caches for the integer path: the float layouts in `int32_t`, state and conv
/// histories in Q15.16. Caller-owned, sizes as `KdaCaches` (`kda_state_len`,
/// `kda_conv_state_len`, in int32 elements); zero them for fresh sequences.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaFixedCaches {
    /// Recurrent states `[N, H, K, V]`, K-first, Q15.16.
    pub recurrent: *mut i32,
    /// Elements at `recurrent`.
    pub recurrent_len: usize,
    /// q conv states `[N, H·K, W−1]`, Q15.16.
    pub conv_q: *mut i32,
    /// Elements at `conv_q`.
    pub conv_q_len: usize,
    /// k conv states.
    pub conv_k: *mut i32,
    /// Elements at `conv_k`.
    pub conv_k_len: usize,
    /// v conv states.
    pub conv_v: *mut i32,
    /// Elements at `conv_v`.
    pub conv_v_len: usize,
}

/// One Q15.16 token for each of `N` sequences (caller-owned buffers).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaFixedTokens {
    /// `[N, hidden]` inputs, Q15.16.
    pub x: *const i32,
    /// Elements at `x`.
    pub x_len: usize,
    /// `[N, hidden]` outputs, Q15.16, written.
    pub out: *mut i32,
    /// Elements at `out` (= `x_len`).
    pub out_len: usize,
}

/// `int32_t` elements of the parameter buffer `kda_fixed_init` fills, written to `*len`.
///
/// # Safety
/// `cfg`: a valid config; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_fixed_params_len(cfg: *const KdaConfig, len: *mut usize) -> KdaStatus {
    guard(|| {
        // SAFETY (both): the caller's contract.
        let c = unsafe { config(cfg) }?;
        unsafe { put(len, fixed::params_len(&c)?) }
    })
}

/// `int32_t` elements of workspace `kda_fixed_decode_step` needs (any batch), written to
/// `*len`. The caller owns the workspace.
///
/// # Safety
/// `cfg`: a valid config; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_fixed_workspace_len(
    cfg: *const KdaConfig,
    len: *mut usize,
) -> KdaStatus {
    guard(|| {
        // SAFETY (both): the caller's contract.
        let c = unsafe { config(cfg) }?;
        unsafe { put(len, kda_core::fixed_workspace_len(&c)?) }
    })
}

/// Prepares int8 weights (every matrix `KDA_DTYPE_I8` with one scale per row, e.g. from
/// `kda_quantize_layer`; row-major) for the integer path: converts the scales and small
/// parameters to integers once (the only float arithmetic) into `params` (caller-owned, at
/// least `kda_fixed_params_len` elements), and stores the prepared layer in `*layer`.
///
/// # Safety
/// `layer`: writable `KdaFixedLayer` storage; `cfg`, `weights`: valid; `params`: `params_len`
/// writable elements that outlive the handle, as does the weight data.
#[no_mangle]
pub unsafe extern "C" fn kda_fixed_init(
    layer: *mut KdaFixedLayer,
    cfg: *const KdaConfig,
    weights: *const KdaWeights,
    params: *mut i32,
    params_len: usize,
) -> KdaStatus {
    guard(|| {
        let p = out_ptr(layer)?.cast::<Inner>();
        // SAFETY: writable, aligned, large enough (static assertions); cleared first so a
        // failed init leaves the handle unusable.
        unsafe { core::ptr::addr_of_mut!((*p).magic).write(0) };
        // SAFETY (all): the caller's contract.
        let c = unsafe { config(cfg) }?;
        let w = unsafe { get(weights) }?;
        let w: kda_core::KdaWeights<'static> = unsafe { w.to_core_dense(&c) }?;
        let mut b = Buffers::new();
        let params: &'static mut [i32] = unsafe { b.slice_mut(params, params_len) }?;
        crate::weights::check_weights::<false>(&b, &w)?;
        let range = (params.as_ptr().addr(), core::mem::size_of_val(params));
        let fw = fixed::prepare(&c, &w, params)?;
        // SAFETY: as above.
        unsafe {
            p.write(Inner {
                magic: MAGIC,
                cfg: c,
                params: range,
                weights: fw,
            })
        };
        Ok(())
    })
}

/// The prepared layer in an initialised handle.
///
/// # Safety
/// A non-NULL `layer` points to initialised `KdaFixedLayer` memory.
unsafe fn inner<'a>(layer: *const KdaFixedLayer) -> Res<&'a Inner> {
    // SAFETY: the caller's contract.
    let storage = unsafe { get(layer) }?;
    let p = core::ptr::from_ref(storage).cast::<Inner>();
    // SAFETY: aligned, in bounds; the first word is written by every `kda_fixed_init`.
    if unsafe { core::ptr::addr_of!((*p).magic).read() } != MAGIC {
        return Err(KdaStatus::BadHandle.into());
    }
    // SAFETY: the magic word says a valid `Inner` was written here.
    Ok(unsafe { &*p })
}

/// One decode step in integer arithmetic only: one Q15.16 token for each of `N` sequences,
/// caches updated in place. `workspace`: caller-owned, at least `kda_fixed_workspace_len`
/// elements. Results are bitwise the same on every target. A writable buffer overlapping the
/// parameter buffer is `KDA_STATUS_OVERLAP`; one overlapping the int8 weight data is not
/// detected on this path (the handle does not keep their addresses): don't.
///
/// # Safety
/// `layer`: an initialised handle; `tokens`, `caches`: valid structs whose pointers hold as
/// many elements as they say; `workspace`: `workspace_len` writable elements.
#[no_mangle]
pub unsafe extern "C" fn kda_fixed_decode_step(
    layer: *const KdaFixedLayer,
    tokens: *const KdaFixedTokens,
    caches: *const KdaFixedCaches,
    workspace: *mut i32,
    workspace_len: usize,
) -> KdaStatus {
    guard(|| {
        // SAFETY (all): the caller's contract; every pointer is checked by `Buffers`.
        let l = unsafe { inner(layer) }?;
        let t = unsafe { get(tokens) }?;
        let c = unsafe { get(caches) }?;
        let mut b = Buffers::new();
        let x = unsafe { b.slice(t.x, t.x_len) }?;
        let out = unsafe { b.slice_mut(t.out, t.out_len) }?;
        let caches = unsafe {
            FixedCachesMut {
                recurrent: b.slice_mut(c.recurrent, c.recurrent_len)?,
                conv_q: b.slice_mut(c.conv_q, c.conv_q_len)?,
                conv_k: b.slice_mut(c.conv_k, c.conv_k_len)?,
                conv_v: b.slice_mut(c.conv_v, c.conv_v_len)?,
            }
        };
        let ws = unsafe { b.slice_mut(workspace, workspace_len) }?;
        b.check_range_not_written(l.params.0, l.params.1)?;
        Ok(kda_core::decode_step_fixed(
            &l.cfg, &l.weights, x, caches, out, ws,
        )?)
    })
}
