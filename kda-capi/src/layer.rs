//! The float layer: a caller-owned handle holding a validated [`kda_core::KdaLayer`], prefill
//! forward and decode step.

use core::ffi::c_char;
use core::mem::{align_of, size_of};

use kda_core::{Batch, CachesMut, InitialCaches, Serial};

use crate::config::{config, options, KdaConfig, KdaOptions};
use crate::ffi::{get, out_ptr, put, Buffers, CBuf};
use crate::status::{guard, KdaStatus, Res};
use crate::weights::{check_weights, KdaWeights};

/// Size of [`KdaLayer`] in 8-byte words.
pub const KDA_LAYER_WORDS: usize = 160;

/// `kda_forward`'s `init`: every sequence starts from zero caches (their contents are ignored).
pub const KDA_INIT_ZERO: u32 = 0;
/// `kda_forward`'s `init`: the caches hold each sequence's state so far (continuation).
pub const KDA_INIT_GIVEN: u32 = 1;

/// A validated layer. Opaque, fixed size: the caller owns the storage (stack, `static`,
/// heap) and `kda_layer_init` fills it. It holds views of the weight data it was initialised
/// with (which must outlive it, unchanged) and nothing else: no destructor, and it may be
/// copied with `memcpy`. A call on a handle that was not initialised successfully returns
/// `KDA_STATUS_BAD_HANDLE`.
#[repr(C)]
#[derive(Debug)]
pub struct KdaLayer {
    /// Opaque.
    pub opaque: [u64; KDA_LAYER_WORDS],
}

/// Marks an initialised handle ("KDA-LAYR").
const MAGIC: u64 = 0x4B44_412D_4C41_5952;

/// What a [`KdaLayer`] holds.
struct Inner {
    magic: u64,
    layer: kda_core::KdaLayer<'static>,
}

const _: () = assert!(size_of::<Inner>() <= size_of::<KdaLayer>());
const _: () = assert!(align_of::<Inner>() <= align_of::<KdaLayer>());

/// `N` sequences' caches (layouts: kda-core's `cache` module). The caller owns the four
/// buffers: `recurrent` holds `N · kda_state_len` floats, each conv buffer
/// `N · kda_conv_state_len`; zero them for fresh sequences (or pass `KDA_INIT_ZERO`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaCaches {
    /// Recurrent states `[N, H, K, V]`, K-first.
    pub recurrent: *mut f32,
    /// Floats at `recurrent`.
    pub recurrent_len: usize,
    /// q conv states `[N, H·K, W−1]`.
    pub conv_q: *mut f32,
    /// Floats at `conv_q`.
    pub conv_q_len: usize,
    /// k conv states `[N, H·K, W−1]`.
    pub conv_k: *mut f32,
    /// Floats at `conv_k`.
    pub conv_k_len: usize,
    /// v conv states `[N, H·K, W−1]`.
    pub conv_v: *mut f32,
    /// Floats at `conv_v`.
    pub conv_v_len: usize,
}

/// The tokens of one `kda_forward`: `N` packed sequences (caller-owned buffers).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaBatch {
    /// `[T, hidden]` input rows.
    pub x: *const f32,
    /// Floats at `x` (`T · hidden`).
    pub x_len: usize,
    /// `[N + 1]` offsets: sequence `n` is rows `cu_seqlens[n] .. cu_seqlens[n+1]`; starts at 0,
    /// non-decreasing, ends at `T`.
    pub cu_seqlens: *const usize,
    /// Entries at `cu_seqlens` (`N + 1`).
    pub cu_seqlens_len: usize,
    /// `[T, hidden]` output rows, written.
    pub out: *mut f32,
    /// Floats at `out` (= `x_len`).
    pub out_len: usize,
}

/// One token for each of `N` sequences (`kda_decode_step`; caller-owned buffers).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaTokens {
    /// `[N, hidden]` input rows.
    pub x: *const f32,
    /// Floats at `x`.
    pub x_len: usize,
    /// `[N, hidden]` output rows, written.
    pub out: *mut f32,
    /// Floats at `out` (= `x_len`).
    pub out_len: usize,
}

/// The core layer `cfg` + `weights` + `opts` would be.
///
/// # Safety
/// As [`kda_layer_init`].
unsafe fn build(
    cfg: *const KdaConfig,
    weights: *const KdaWeights,
    opts: *const KdaOptions,
) -> Res<kda_core::KdaLayer<'static>> {
    // SAFETY (all three): the caller's contract.
    let c = unsafe { config(cfg) }?;
    let w = unsafe { get(weights) }?;
    let o = unsafe { options(opts) }?;
    // SAFETY: the caller's contract: the weight data outlives every use of the handle.
    let w: kda_core::KdaWeights<'static> = unsafe { w.to_core(&c) }?;
    Ok(kda_core::KdaLayer::new(&c, w, o)?)
}

/// Validates `cfg`, `weights` (each descriptor: pointers, lengths, dtype, layout, shapes) and
/// `opts` (NULL = defaults) once, and stores the layer in `*layer`. On failure `*layer` is
/// marked uninitialised. The weight data (not the `KdaWeights` struct itself) must stay alive
/// and unchanged while the handle is used. `kda_layer_explain` says what is wrong in words.
///
/// # Safety
/// `layer`: writable `KdaLayer` storage; `cfg`, `weights`: valid structs; `opts`: valid or
/// NULL; every descriptor in `weights` points to as many elements as it says.
#[no_mangle]
pub unsafe extern "C" fn kda_layer_init(
    layer: *mut KdaLayer,
    cfg: *const KdaConfig,
    weights: *const KdaWeights,
    opts: *const KdaOptions,
) -> KdaStatus {
    guard(|| {
        let p = out_ptr(layer)?.cast::<Inner>();
        // SAFETY: `p` is the caller's writable, aligned handle storage, large enough for
        // `Inner` (static assertions above); the magic word is written first so a failed init
        // leaves the handle unusable.
        unsafe { core::ptr::addr_of_mut!((*p).magic).write(0) };
        // SAFETY: forwarded contract.
        let l = unsafe { build(cfg, weights, opts) }?;
        // SAFETY: as above.
        unsafe {
            p.write(Inner {
                magic: MAGIC,
                layer: l,
            })
        };
        Ok(())
    })
}

/// Writes the message of what `kda_layer_init` with these arguments returns ("ok" on success,
/// else e.g. "config `heads`: must be at least 1" or "`q_proj.weight` has 100 elements,
/// expected 2048") into `msg` (caller-owned, `msg_cap` bytes, always NUL-terminated,
/// truncated to fit), and returns that status.
///
/// # Safety
/// As [`kda_layer_init`]; `msg`: `msg_cap` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kda_layer_explain(
    cfg: *const KdaConfig,
    weights: *const KdaWeights,
    opts: *const KdaOptions,
    msg: *mut c_char,
    msg_cap: usize,
) -> KdaStatus {
    use core::fmt::Write;
    // SAFETY: the caller's contract.
    let buf = match unsafe { Buffers::new().slice_mut(msg.cast::<u8>(), msg_cap) } {
        Ok(b) => b,
        Err(f) => return f.status,
    };
    let mut out = CBuf::new(buf);
    // SAFETY: forwarded contract.
    let r = guard(|| {
        unsafe { build(cfg, weights, opts) }
            .map(|_| ())
            .inspect_err(|f| {
                let _ = match f.error {
                    Some(e) => write!(out, "{e}"),
                    None => write!(out, "{}", describe(f.status)),
                };
            })
    });
    if r == KdaStatus::Ok {
        let _ = write!(out, "ok");
    }
    r
}

/// The status message as a `&str`.
fn describe(s: KdaStatus) -> &'static str {
    crate::status::message(s.code()).to_str().unwrap_or("?")
}

/// The layer in an initialised handle.
///
/// # Safety
/// A non-NULL `layer` points to a `KdaLayer` that is initialised memory.
pub(crate) unsafe fn layer_of<'a>(layer: *const KdaLayer) -> Res<&'a kda_core::KdaLayer<'static>> {
    // SAFETY: the caller's contract (NULL and alignment checked).
    let storage = unsafe { get(layer) }?;
    let p = core::ptr::from_ref(storage).cast::<Inner>();
    // SAFETY: aligned, in bounds (static assertions); the first word is always written by
    // `kda_layer_init`.
    if unsafe { core::ptr::addr_of!((*p).magic).read() } != MAGIC {
        return Err(KdaStatus::BadHandle.into());
    }
    // SAFETY: the magic word says `kda_layer_init` wrote a valid `Inner` here.
    Ok(unsafe { &(*p).layer })
}

/// The caches as slices, registered in `b`.
///
/// # Safety
/// A non-NULL `caches` is a valid struct whose pointers hold as many floats as it says.
unsafe fn caches_of<'a>(b: &mut Buffers, caches: *const KdaCaches) -> Res<CachesMut<'a>> {
    // SAFETY (all): the caller's contract.
    let c = unsafe { get(caches) }?;
    unsafe {
        Ok(CachesMut {
            recurrent: b.slice_mut(c.recurrent, c.recurrent_len)?,
            conv_q: b.slice_mut(c.conv_q, c.conv_q_len)?,
            conv_k: b.slice_mut(c.conv_k, c.conv_k_len)?,
            conv_v: b.slice_mut(c.conv_v, c.conv_v_len)?,
        })
    }
}

/// Runs the layer over the packed sequences of `batch` (prefill), one thread.
///
/// * `caches`: `N` sequences' caches, read as initial caches when `init` is `KDA_INIT_GIVEN`
///   (zeroed first with `KDA_INIT_ZERO`), and left holding the final caches.
/// * `workspace`: caller-owned scratch of `workspace_len` floats, at least
///   `kda_layer_workspace_len(layer, 1)`; more lets it process more tokens at a time (in
///   `KDA_MODE_AUTO` size it for the longest sequence).
///
/// Every length and offset is checked before anything is written.
///
/// # Safety
/// `layer`: an initialised handle; `batch`, `caches`: valid structs whose pointers hold as many
/// elements as they say; `workspace`: `workspace_len` writable floats.
#[no_mangle]
pub unsafe extern "C" fn kda_forward(
    layer: *const KdaLayer,
    batch: *const KdaBatch,
    caches: *const KdaCaches,
    init: u32,
    workspace: *mut f32,
    workspace_len: usize,
) -> KdaStatus {
    guard(|| {
        // SAFETY (all): the caller's contract; every pointer is checked by `Buffers`.
        let l = unsafe { layer_of(layer) }?;
        let bt = unsafe { get(batch) }?;
        let init = match init {
            KDA_INIT_ZERO => InitialCaches::Zero,
            KDA_INIT_GIVEN => InitialCaches::Given,
            _ => return Err(KdaStatus::Config.into()),
        };
        let mut b = Buffers::new();
        let x = unsafe { b.slice(bt.x, bt.x_len) }?;
        let cu = unsafe { b.slice(bt.cu_seqlens, bt.cu_seqlens_len) }?;
        let out = unsafe { b.slice_mut(bt.out, bt.out_len) }?;
        let c = unsafe { caches_of(&mut b, caches) }?;
        let ws = unsafe { b.slice_mut(workspace, workspace_len) }?;
        check_weights::<true>(&b, l.weights())?;
        let batch = Batch {
            x,
            cu_seqlens: cu,
            out,
        };
        Ok(l.forward(batch, c, init, ws, &Serial)?)
    })
}

/// One decode step: one token for each of `N` sequences, each with its own caches (updated in
/// place), always token by token. `workspace`: caller-owned, at least
/// `kda_layer_decode_workspace_len(layer, 1)` floats (`(layer, N)` runs all `N` in one block).
///
/// # Safety
/// As [`kda_forward`].
#[no_mangle]
pub unsafe extern "C" fn kda_decode_step(
    layer: *const KdaLayer,
    tokens: *const KdaTokens,
    caches: *const KdaCaches,
    workspace: *mut f32,
    workspace_len: usize,
) -> KdaStatus {
    guard(|| {
        // SAFETY (all): the caller's contract; every pointer is checked by `Buffers`.
        let l = unsafe { layer_of(layer) }?;
        let t = unsafe { get(tokens) }?;
        let mut b = Buffers::new();
        let x = unsafe { b.slice(t.x, t.x_len) }?;
        let out = unsafe { b.slice_mut(t.out, t.out_len) }?;
        let c = unsafe { caches_of(&mut b, caches) }?;
        let ws = unsafe { b.slice_mut(workspace, workspace_len) }?;
        check_weights::<true>(&b, l.weights())?;
        Ok(l.decode_step(x, out, c, ws, &Serial)?)
    })
}

/// Floats of workspace for `kda_forward` on this layer with blocks of up to `block_tokens`
/// tokens, written to `*len` (the caller owns the workspace).
///
/// # Safety
/// `layer`: an initialised handle; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_layer_workspace_len(
    layer: *const KdaLayer,
    block_tokens: usize,
    len: *mut usize,
) -> KdaStatus {
    guard(|| {
        // SAFETY (both): the caller's contract.
        let l = unsafe { layer_of(layer) }?;
        unsafe { put(len, l.workspace_len(block_tokens, 1)?) }
    })
}

/// Floats of workspace for `kda_decode_step` on this layer over `batch` sequences in one block,
/// written to `*len` (the caller owns the workspace).
///
/// # Safety
/// `layer`: an initialised handle; `len`: writable.
#[no_mangle]
pub unsafe extern "C" fn kda_layer_decode_workspace_len(
    layer: *const KdaLayer,
    batch: usize,
    len: *mut usize,
) -> KdaStatus {
    guard(|| {
        // SAFETY (both): the caller's contract.
        let l = unsafe { layer_of(layer) }?;
        unsafe { put(len, l.decode_workspace_len(batch, 1)?) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_has_room() {
        // The static assertions guarantee it; this shows the margin on the test target.
        let (inner, handle) = (size_of::<Inner>(), size_of::<KdaLayer>());
        println!("KdaLayer: {inner} of {handle} bytes used");
        assert!(inner <= handle);
        let (inner, handle) = (
            size_of::<crate::fixed::Inner>(),
            size_of::<crate::KdaFixedLayer>(),
        );
        println!("KdaFixedLayer: {inner} of {handle} bytes used");
        assert!(inner <= handle);
    }
}
