//! Quantised matrices in [`KdaTensor`]s: GGUF blocks (`KDA_DTYPE_GGUF_BASE` + the ggml type
//! id, the blocks' bytes as stored) and compressed-tensors `pack-quantized` groups
//! (`KDA_DTYPE_GROUPS`, a [`KdaGroups`] handle made by [`kda_groups_init`]).

use core::ffi::c_void;
use core::mem::{align_of, size_of};

use kda_core::quant::{BlockFormat, Blocks, GroupFormat, GroupTensors, Groups, Scales};
use kda_core::{bf16, f16, Data, KdaError};

use crate::dtype::{KDA_DTYPE_BF16, KDA_DTYPE_F16, KDA_DTYPE_F32};
use crate::ffi::{get, out_ptr, weight_slice};
use crate::status::{guard, Fail, KdaStatus, Res};

/// Size of [`KdaGroups`] in 8-byte words.
pub const KDA_GROUPS_WORDS: usize = 16;

/// The stored tensors of one compressed-tensors `pack-quantized` matrix `[rows, cols]`
/// (caller-owned; `kda_groups_init` checks them). Quants are stored as compressed-tensors
/// stores them: unsigned `u = q + 2^(bits−1)`, packed lowest bits first into 32-bit words,
/// each row padded to whole words; the weight is `(u − z) · scale` with `z = 2^(bits−1)`
/// (symmetric) or the stored zero point.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KdaGroupTensors {
    /// `weight_packed`: `rows · ⌈cols · bits / 32⌉` words.
    pub packed: *const u32,
    /// Words at `packed`.
    pub packed_len: usize,
    /// `weight_scale`: `rows · cols / group_size` scales of `scales_dtype`.
    pub scales: *const c_void,
    /// Scales at `scales`.
    pub scales_len: usize,
    /// `KDA_DTYPE_F32`, `KDA_DTYPE_BF16` or `KDA_DTYPE_F16`.
    pub scales_dtype: u32,
    /// Bits per quant: 4 or 8.
    pub bits: u32,
    /// `weight_zero_point` (asymmetric form): `⌈rows · bits / 32⌉ · cols / group_size` words,
    /// packed along the rows; NULL with `zeros_len` 0 for the symmetric form.
    pub zeros: *const u32,
    /// Words at `zeros`.
    pub zeros_len: usize,
    /// Weights per scale along a row (`cols` for one scale per row); must divide `cols`.
    pub group_size: usize,
    /// Rows (output features).
    pub rows: usize,
    /// Weights per row (input features).
    pub cols: usize,
}

/// A checked `pack-quantized` matrix. Opaque, fixed size, caller-owned (like `KdaLayer`): it
/// holds views of the tensors it was initialised with, which must outlive it, unchanged. A
/// layer whose descriptor points to it keeps pointing to it: keep it in place while the
/// layer is used.
#[repr(C)]
#[derive(Debug)]
pub struct KdaGroups {
    /// Opaque.
    pub opaque: [u64; KDA_GROUPS_WORDS],
}

/// Marks an initialised handle ("KDA-GRPS").
const MAGIC: u64 = 0x4B44_412D_4752_5053;

struct Inner {
    magic: u64,
    groups: Groups<'static>,
}

const _: () = assert!(size_of::<Inner>() <= size_of::<KdaGroups>());
const _: () = assert!(align_of::<Inner>() <= align_of::<KdaGroups>());

/// Bytes of `words` 32-bit words at `p` (checked: NULL, alignment, size).
///
/// # Safety
/// `p`: `words` valid words for `'a`.
unsafe fn word_bytes<'a>(p: *const u32, words: usize) -> Res<&'a [u8]> {
    // SAFETY: the caller's contract; `weight_slice` checks NULL, alignment and size.
    let w: &'a [u32] = unsafe { weight_slice(p, words) }?;
    let n = words
        .checked_mul(4)
        .ok_or(Fail::from(KdaStatus::Overflow))?;
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: the `n` bytes of the `words` words just checked; u8 has no alignment.
    Ok(unsafe { core::slice::from_raw_parts(w.as_ptr().cast::<u8>(), n) })
}

/// # Safety
/// As [`kda_groups_init`].
unsafe fn build(t: &KdaGroupTensors) -> Res<Groups<'static>> {
    let arg = "weight_packed";
    let bits = u8::try_from(t.bits).map_err(|_| KdaError::Weights {
        arg,
        reason: "group-quantised weights must have 4 or 8 bits",
    })?;
    // SAFETY (all): the caller's contract; every pointer is checked by `weight_slice`.
    let scales = match t.scales_dtype {
        KDA_DTYPE_F32 => {
            Scales::F32(unsafe { weight_slice(t.scales.cast::<f32>(), t.scales_len) }?)
        }
        KDA_DTYPE_BF16 => {
            Scales::Bf16(unsafe { weight_slice(t.scales.cast::<bf16>(), t.scales_len) }?)
        }
        KDA_DTYPE_F16 => {
            Scales::F16(unsafe { weight_slice(t.scales.cast::<f16>(), t.scales_len) }?)
        }
        _ => {
            return Err(KdaError::Weights {
                arg: "weight_scale",
                reason: "scales_dtype must be KDA_DTYPE_F32, KDA_DTYPE_BF16 or KDA_DTYPE_F16",
            }
            .into())
        }
    };
    if t.scales.is_null() {
        return Err(KdaStatus::NullPointer.into());
    }
    let zeros = if t.zeros.is_null() && t.zeros_len == 0 {
        None
    } else {
        Some(unsafe { word_bytes(t.zeros, t.zeros_len) }?)
    };
    if t.packed.is_null() {
        return Err(KdaStatus::NullPointer.into());
    }
    let tensors = GroupTensors {
        packed: unsafe { word_bytes(t.packed, t.packed_len) }?,
        scales,
        zeros,
    };
    let format = GroupFormat {
        bits,
        group: t.group_size,
    };
    Ok(Groups::new(arg, format, tensors, t.rows, t.cols)?)
}

/// Checks the tensors of one `pack-quantized` matrix and stores its view in `*out`, for
/// `KdaTensor`s of dtype `KDA_DTYPE_GROUPS`. Statuses: `KDA_STATUS_WEIGHTS` (bits not 4 or 8,
/// a group size that does not divide `cols`, an unknown `scales_dtype`), `KDA_STATUS_LENGTH`
/// (a tensor of the wrong size), `KDA_STATUS_NULL_POINTER`, `KDA_STATUS_BAD_ALIGNMENT`,
/// `KDA_STATUS_OVERFLOW`. On failure `*out` is marked uninitialised.
///
/// # Safety
/// `out`: writable `KdaGroups` storage; `t`: a valid struct whose pointers point to as many
/// elements as it says, alive and unchanged while `*out` (or a layer using it) is used.
#[no_mangle]
pub unsafe extern "C" fn kda_groups_init(
    out: *mut KdaGroups,
    t: *const KdaGroupTensors,
) -> KdaStatus {
    guard(|| {
        let p = out_ptr(out)?.cast::<Inner>();
        // SAFETY: `p` is the caller's writable, aligned handle storage, large enough for
        // `Inner` (static assertions above); the magic word is written first so a failed init
        // leaves the handle unusable.
        unsafe { core::ptr::addr_of_mut!((*p).magic).write(0) };
        // SAFETY: the caller's contract.
        let t = unsafe { get(t) }?;
        // SAFETY: forwarded contract.
        let groups = unsafe { build(t) }?;
        // SAFETY: as above.
        unsafe {
            p.write(Inner {
                magic: MAGIC,
                groups,
            })
        };
        Ok(())
    })
}

/// The group matrix of an initialised [`KdaGroups`] at `data`.
///
/// # Safety
/// `data` points to a [`KdaGroups`] (initialised or not), alive and unchanged for `'a`.
pub(crate) unsafe fn groups_view<'a>(data: *const c_void) -> Res<&'a Groups<'a>> {
    // SAFETY: the caller's contract; `get` checks NULL and alignment.
    let inner = unsafe { get(data.cast::<Inner>()) }?;
    if inner.magic != MAGIC {
        return Err(KdaStatus::BadHandle.into());
    }
    Ok(&inner.groups)
}

/// `len` bytes of GGUF blocks of ggml type `id` at `data`, a `elems`-weight matrix.
///
/// # Safety
/// `data`: `len` valid bytes, alive and unchanged for `'a`.
pub(crate) unsafe fn blocks<'a>(
    data: *const c_void,
    len: usize,
    id: u32,
    name: &'static str,
    elems: usize,
) -> Res<Data<'a>> {
    let format = BlockFormat::from_ggml_type(id).ok_or(KdaError::Weights {
        arg: name,
        reason: "unknown GGUF block type (KDA_DTYPE_GGUF_BASE + ggml type id)",
    })?;
    // SAFETY: the caller's contract; `weight_slice` checks NULL and size.
    let bytes = unsafe { weight_slice(data.cast::<u8>(), len) }?;
    Ok(Data::Blocks(Blocks::new(name, format, bytes, elems)?))
}
