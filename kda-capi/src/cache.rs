//! Recurrent-state layout conversions (kda-core keeps states K-first; fla and vLLM V-first).

use crate::ffi::Buffers;
use crate::status::{guard, KdaStatus};

/// Which transpose to run.
#[derive(Clone, Copy)]
enum Direction {
    KFirstToVFirst,
    VFirstToKFirst,
}

/// # Safety
/// `src` / `dst`: `src_len` / `dst_len` valid floats.
unsafe fn convert(
    dir: Direction,
    src: *const f32,
    src_len: usize,
    dst: *mut f32,
    dst_len: usize,
    [k, v]: [usize; 2],
) -> KdaStatus {
    guard(|| {
        let mut b = Buffers::new();
        // SAFETY (both): the caller's contract; `Buffers` checks them and their overlap.
        let s = unsafe { b.slice(src, src_len) }?;
        let d = unsafe { b.slice_mut(dst, dst_len) }?;
        match dir {
            Direction::KFirstToVFirst => kda_core::k_first_to_v_first(s, d, k, v)?,
            Direction::VFirstToKFirst => kda_core::v_first_to_k_first(s, d, k, v)?,
        }
        Ok(())
    })
}

/// Converts recurrent states from K-first `[.., K, V]` (kda's layout) to V-first `[.., V, K]`
/// (fla / vLLM), for any number of `[K, V]` blocks. `src` and `dst` are caller-owned, of equal
/// length (a multiple of `k · v`), and must not overlap. Exact (a transpose).
///
/// # Safety
/// `src` / `dst`: `src_len` / `dst_len` valid floats.
#[no_mangle]
pub unsafe extern "C" fn kda_k_first_to_v_first(
    src: *const f32,
    src_len: usize,
    dst: *mut f32,
    dst_len: usize,
    k: usize,
    v: usize,
) -> KdaStatus {
    // SAFETY: forwarded contract.
    unsafe {
        convert(
            Direction::KFirstToVFirst,
            src,
            src_len,
            dst,
            dst_len,
            [k, v],
        )
    }
}

/// Converts recurrent states from V-first `[.., V, K]` to K-first `[.., K, V]`; as
/// `kda_k_first_to_v_first`.
///
/// # Safety
/// `src` / `dst`: `src_len` / `dst_len` valid floats.
#[no_mangle]
pub unsafe extern "C" fn kda_v_first_to_k_first(
    src: *const f32,
    src_len: usize,
    dst: *mut f32,
    dst_len: usize,
    k: usize,
    v: usize,
) -> KdaStatus {
    // SAFETY: forwarded contract.
    unsafe {
        convert(
            Direction::VFirstToKFirst,
            src,
            src_len,
            dst,
            dst_len,
            [k, v],
        )
    }
}
