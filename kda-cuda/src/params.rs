//! `#[repr(C)]` mirrors of the kernels' parameter structs (one struct per kernel, passed by
//! value). Device pointers are `u64` (`CUdeviceptr`); 0 is a null pointer.
//!
//! The C side pins every field offset and each struct's size with `KDA_FIELD` / `KDA_SIZE`
//! static assertions (checked by NVRTC); a unit test here parses those lines out of the
//! embedded sources and compares them with `offset_of!` / `size_of` of these structs, so the
//! two sides cannot drift apart silently.

use cudarc::driver::DeviceRepr;

/// Decay-gate parameters (`KdaGate` in gate.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct KdaGate {
    pub a_log: u64,
    pub dt_bias: u64,
    pub form: i32,
    pub lower_bound: f32,
}

/// `GateParams` in gate.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GateParams {
    pub f: u64,
    pub b: u64,
    pub g: u64,
    pub beta: u64,
    pub gate: KdaGate,
    pub f_ld: i64,
    pub b_ld: i64,
    pub tokens: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub pad_: i32,
}

/// `ConvParams` in conv.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ConvParams {
    pub src: u64,
    pub weight: u64,
    pub state_q: u64,
    pub state_k: u64,
    pub state_v: u64,
    pub dst: u64,
    pub cu: u64,
    pub src_ld: i64,
    pub dst_ld: i64,
    pub tokens: i32,
    pub seqs: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub width: i32,
    pub l2_eps: f32,
}

/// `NormParams` in norm.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct NormParams {
    pub o: u64,
    pub gate: u64,
    pub weight: u64,
    pub dst: u64,
    pub o_ld: i64,
    pub gate_ld: i64,
    pub dst_ld: i64,
    pub tokens: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub dst_bf16: i32,
    pub eps: f32,
    pub pad_: i32,
}

/// `RecurrentParams` in recurrent.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecurrentParams {
    pub qkv: u64,
    pub g: u64,
    pub beta: u64,
    pub state: u64,
    pub o: u64,
    pub cu: u64,
    pub qkv_ld: i64,
    pub o_ld: i64,
    pub seqs: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub value_dim: i32,
    pub scale: f32,
    pub pad_: i32,
}

/// `DecodeParams` in decode.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DecodeParams {
    pub proj: u64,
    pub f: u64,
    pub b: u64,
    pub gate: u64,
    pub conv_w: u64,
    pub conv_q: u64,
    pub conv_k: u64,
    pub conv_v: u64,
    pub state: u64,
    pub norm_w: u64,
    pub dst: u64,
    pub gp: KdaGate,
    pub proj_ld: i64,
    pub f_ld: i64,
    pub b_ld: i64,
    pub gate_ld: i64,
    pub dst_ld: i64,
    pub seqs: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub value_dim: i32,
    pub width: i32,
    pub dst_bf16: i32,
    pub scale: f32,
    pub l2_eps: f32,
    pub rms_eps: f32,
    pub pad_: i32,
}

/// `ChunkIntraParams` in chunked.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ChunkIntraParams {
    pub qkv: u64,
    pub g: u64,
    pub beta: u64,
    pub chunks: u64,
    pub qg: u64,
    pub kg: u64,
    pub w: u64,
    pub u: u64,
    pub aqk: u64,
    pub qkv_ld: i64,
    pub n_chunks: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub value_dim: i32,
    pub chunk: i32,
    pub scale: f32,
}

/// `ChunkStateParams` in chunked.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ChunkStateParams {
    pub qg: u64,
    pub kg: u64,
    pub w: u64,
    pub u: u64,
    pub aqk: u64,
    pub g: u64,
    pub chunks: u64,
    pub chunk_first: u64,
    pub state: u64,
    pub o: u64,
    pub o_ld: i64,
    pub seqs: i32,
    pub heads: i32,
    pub head_dim: i32,
    pub value_dim: i32,
    pub chunk: i32,
    pub pad_: i32,
}

/// `CastParams` in cast.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CastParams {
    pub src: u64,
    pub dst: u64,
    pub src_ld: i64,
    pub dst_ld: i64,
    pub rows: i64,
    pub cols: i64,
}

// SAFETY (all impls below): each type is `#[repr(C)]`, made only of u64/i64/i32/f32 fields (and
// the `#[repr(C)]` KdaGate), laid out exactly as the C struct of the same name (checked by the
// `layouts_match_the_cuda_sources` test against the sources' static assertions), so its bytes
// are a valid by-value kernel parameter.
unsafe impl DeviceRepr for GateParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for ConvParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for NormParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for RecurrentParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for DecodeParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for ChunkIntraParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for ChunkStateParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for CastParams {}

/// (struct name, size, [(field, offset)]) of every parameter struct, `pad_` fields excluded.
#[cfg(test)]
macro_rules! layouts {
    ($($s:ident { $($f:ident),* $(,)? })*) => {
        fn rust_layouts() -> Vec<(&'static str, usize, Vec<(&'static str, usize)>)> {
            vec![$((
                stringify!($s),
                core::mem::size_of::<$s>(),
                vec![$((stringify!($f), core::mem::offset_of!($s, $f))),*],
            )),*]
        }
    };
}

#[cfg(test)]
layouts! {
    KdaGate { a_log, dt_bias, form, lower_bound }
    GateParams { f, b, g, beta, gate, f_ld, b_ld, tokens, heads, head_dim }
    ConvParams { src, weight, state_q, state_k, state_v, dst, cu, src_ld, dst_ld, tokens, seqs, heads, head_dim, width, l2_eps }
    NormParams { o, gate, weight, dst, o_ld, gate_ld, dst_ld, tokens, heads, head_dim, dst_bf16, eps }
    RecurrentParams { qkv, g, beta, state, o, cu, qkv_ld, o_ld, seqs, heads, head_dim, value_dim, scale }
    DecodeParams { proj, f, b, gate, conv_w, conv_q, conv_k, conv_v, state, norm_w, dst, gp, proj_ld, f_ld, b_ld, gate_ld, dst_ld, seqs, heads, head_dim, value_dim, width, dst_bf16, scale, l2_eps, rms_eps }
    ChunkIntraParams { qkv, g, beta, chunks, qg, kg, w, u, aqk, qkv_ld, n_chunks, heads, head_dim, value_dim, chunk, scale }
    ChunkStateParams { qg, kg, w, u, aqk, g, chunks, chunk_first, state, o, o_ld, seqs, heads, head_dim, value_dim, chunk }
    CastParams { src, dst, src_ld, dst_ld, rows, cols }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    type CLayout = BTreeMap<String, (Option<usize>, BTreeMap<String, usize>)>;

    /// `KDA_FIELD(S, f, off);` and `KDA_SIZE(S, n);` lines of every embedded source.
    fn c_layouts() -> CLayout {
        let mut out: CLayout = BTreeMap::new();
        for f in crate::kernels::FILES {
            for line in f.source.lines() {
                let line = line.trim();
                let args = |prefix: &str| -> Option<Vec<String>> {
                    let rest = line.strip_prefix(prefix)?.strip_suffix(");")?;
                    Some(rest.split(',').map(|s| s.trim().to_owned()).collect())
                };
                if let Some(a) = args("KDA_FIELD(") {
                    let off: usize = a[2].parse().expect("offset literal");
                    out.entry(a[0].clone())
                        .or_default()
                        .1
                        .insert(a[1].clone(), off);
                } else if let Some(a) = args("KDA_SIZE(") {
                    out.entry(a[0].clone()).or_default().0 =
                        Some(a[1].parse().expect("size literal"));
                }
            }
        }
        out
    }

    #[test]
    fn layouts_match_the_cuda_sources() {
        let c = c_layouts();
        let rust = rust_layouts();
        assert_eq!(
            c.len(),
            rust.len(),
            "C structs {:?}",
            c.keys().collect::<Vec<_>>()
        );
        for (name, size, fields) in rust {
            let (c_size, c_fields) = c
                .get(name)
                .unwrap_or_else(|| panic!("{name} missing in .cu"));
            assert_eq!(*c_size, Some(size), "{name} size");
            assert_eq!(c_fields.len(), fields.len(), "{name} field count");
            for (f, off) in fields {
                assert_eq!(c_fields.get(f), Some(&off), "{name}.{f}");
            }
        }
    }
}
