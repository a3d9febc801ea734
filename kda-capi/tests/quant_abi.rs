//! Quantised matrices through the C entry points: `kda_groups_init`'s checks and the status
//! each bad descriptor gets (the bitwise comparison with the Rust API is the host C example's,
//! .ci/capi.sh).
#![allow(clippy::unwrap_used)]

mod common;

use std::ffi::CStr;

use kda_capi::*;

use common::f32_tensor as f32t;

/// A valid int4 group-32 matrix `[rows, cols]` (bf16 scales, as u16 bits of 1/64).
struct Mat {
    packed: Vec<u32>,
    scales: Vec<u16>,
    zeros: Vec<u32>,
    rows: usize,
    cols: usize,
}

impl Mat {
    fn new(rows: usize, cols: usize) -> Self {
        Mat {
            packed: (0..rows * cols / 8)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761))
                .collect(),
            scales: vec![0x3C80; rows * cols / 32],
            zeros: vec![0x8888_8888; rows.div_ceil(8) * cols / 32],
            rows,
            cols,
        }
    }

    fn tensors(&self) -> KdaGroupTensors {
        KdaGroupTensors {
            packed: self.packed.as_ptr(),
            packed_len: self.packed.len(),
            scales: self.scales.as_ptr().cast(),
            scales_len: self.scales.len(),
            scales_dtype: KDA_DTYPE_BF16,
            bits: 4,
            zeros: std::ptr::null(),
            zeros_len: 0,
            group_size: 32,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

fn init(t: &KdaGroupTensors) -> (KdaStatus, Box<KdaGroups>) {
    let mut g = Box::new(KdaGroups {
        opaque: [0; KDA_GROUPS_WORDS],
    });
    // SAFETY: `t` points to live buffers of the stated lengths (or is the case under test).
    let s = unsafe { kda_groups_init(&mut *g, t) };
    (s, g)
}

#[test]
fn groups_init_checks_every_field() {
    let m = Mat::new(64, 64);
    assert_eq!(init(&m.tensors()).0, KdaStatus::Ok);
    let with_zeros = KdaGroupTensors {
        zeros: m.zeros.as_ptr(),
        zeros_len: m.zeros.len(),
        ..m.tensors()
    };
    assert_eq!(init(&with_zeros).0, KdaStatus::Ok);
    let cases: [(&str, KdaGroupTensors, KdaStatus); 9] = [
        (
            "bits 3",
            KdaGroupTensors {
                bits: 3,
                ..m.tensors()
            },
            KdaStatus::Weights,
        ),
        (
            "bits 300",
            KdaGroupTensors {
                bits: 300,
                ..m.tensors()
            },
            KdaStatus::Weights,
        ),
        (
            "group 48",
            KdaGroupTensors {
                group_size: 48,
                ..m.tensors()
            },
            KdaStatus::Weights,
        ),
        (
            "group 0",
            KdaGroupTensors {
                group_size: 0,
                ..m.tensors()
            },
            KdaStatus::Weights,
        ),
        (
            "packed short",
            KdaGroupTensors {
                packed_len: m.packed.len() - 1,
                ..m.tensors()
            },
            KdaStatus::Length,
        ),
        (
            "scales count",
            KdaGroupTensors {
                scales_len: m.scales.len() - 1,
                ..m.tensors()
            },
            KdaStatus::Length,
        ),
        (
            "scales dtype",
            KdaGroupTensors {
                scales_dtype: KDA_DTYPE_I8,
                ..m.tensors()
            },
            KdaStatus::Weights,
        ),
        (
            "zeros short",
            KdaGroupTensors {
                zeros: m.zeros.as_ptr(),
                zeros_len: 1,
                ..m.tensors()
            },
            KdaStatus::Length,
        ),
        (
            "packed NULL",
            KdaGroupTensors {
                packed: std::ptr::null(),
                ..m.tensors()
            },
            KdaStatus::NullPointer,
        ),
    ];
    for (what, t, want) in cases {
        assert_eq!(init(&t).0, want, "{what}");
    }
    let odd = KdaGroupTensors {
        // SAFETY: one byte past the start, still inside the buffer; misaligned on purpose.
        packed: unsafe { m.packed.as_ptr().cast::<u8>().add(1) }.cast(),
        ..m.tensors()
    };
    assert_eq!(init(&odd).0, KdaStatus::BadAlignment);
    // SAFETY: a NULL handle pointer is the case under test.
    assert_eq!(
        unsafe { kda_groups_init(std::ptr::null_mut(), &m.tensors()) },
        KdaStatus::NullPointer
    );
}

/// A Kimi Linear layer (hidden 64, 2 heads × 32) with `q_proj` replaced by `q`.
fn layer_status(q: KdaTensor, o_norm: Option<KdaTensor>) -> (KdaStatus, String) {
    let (hd, h, k) = (64, 2, 32);
    let cfg = kda_config_kimi_linear(hd, h, k);
    let d = h * k;
    let v = vec![0.01f32; d * hd];
    let conv = vec![0.1f32; d * 4];
    let a_log = vec![0.5f32; h];
    let low = vec![0.01f32; k * hd];
    let b = vec![0.01f32; h * hd];
    let norm = vec![1f32; k];
    let w = KdaWeights {
        q_proj: q,
        k_proj: f32t(&v),
        v_proj: f32t(&v),
        q_conv: f32t(&conv),
        k_conv: f32t(&conv),
        v_conv: f32t(&conv),
        a_log: f32t(&a_log),
        dt_bias: f32t(&[]),
        decay_proj: f32t(&low),
        decay_up: f32t(&low),
        b_proj: f32t(&b),
        gate_proj: f32t(&low),
        gate_up: f32t(&low),
        o_norm: o_norm.unwrap_or_else(|| f32t(&norm)),
        o_proj: f32t(&v),
    };
    let mut msg = [0 as std::ffi::c_char; 200];
    // SAFETY: every pointer refers to live buffers of the stated lengths (or is under test).
    let s = unsafe { kda_layer_explain(&cfg, &w, std::ptr::null(), msg.as_mut_ptr(), msg.len()) };
    // SAFETY: NUL-terminated by kda_layer_explain.
    let text = unsafe { CStr::from_ptr(msg.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    if s == KdaStatus::Ok {
        // The integer path reads dense matrices only.
        let mut n = 0;
        // SAFETY: valid config, writable length.
        assert_eq!(unsafe { kda_fixed_params_len(&cfg, &mut n) }, KdaStatus::Ok);
        let mut params = vec![0i32; n];
        let mut fl = KdaFixedLayer {
            opaque: [0; KDA_FIXED_LAYER_WORDS],
        };
        // SAFETY: every pointer refers to live buffers of the stated lengths.
        let f = unsafe { kda_fixed_init(&mut fl, &cfg, &w, params.as_mut_ptr(), n) };
        assert_eq!(
            f,
            KdaStatus::Weights,
            "the integer path took a quantised matrix"
        );
    }
    (s, text)
}

fn groups_tensor(g: &KdaGroups, len: usize) -> KdaTensor {
    KdaTensor {
        data: (g as *const KdaGroups).cast(),
        len,
        dtype: KDA_DTYPE_GROUPS,
        layout: KDA_LAYOUT_ROWS,
        scales: std::ptr::null(),
        scales_len: 0,
    }
}

#[test]
fn quantised_descriptors_get_clear_statuses() {
    let dense = vec![0.01f32; 64 * 64];
    assert_eq!(layer_status(f32t(&dense), None).0, KdaStatus::Ok);
    let m = Mat::new(64, 64);
    let (s, g) = init(&m.tensors());
    assert_eq!(s, KdaStatus::Ok);
    assert_eq!(
        layer_status(groups_tensor(&g, 64 * 64), None).0,
        KdaStatus::Ok
    );
    // A handle kda_groups_init did not initialise (or failed on).
    let (s, bad) = init(&KdaGroupTensors {
        bits: 5,
        ..m.tensors()
    });
    assert_eq!(s, KdaStatus::Weights);
    assert_eq!(
        layer_status(groups_tensor(&bad, 64 * 64), None).0,
        KdaStatus::BadHandle
    );
    // A matrix of the wrong shape for its slot.
    let small = Mat::new(32, 64);
    let (_, gs) = init(&small.tensors());
    let (s, text) = layer_status(groups_tensor(&gs, 32 * 64), None);
    assert_eq!(s, KdaStatus::Length, "{text}");
    assert!(text.contains("q_proj.weight"), "{text}");
    // Quantised formats are for matrices only.
    let (s, text) = layer_status(groups_tensor(&g, 64 * 64), Some(groups_tensor(&g, 32)));
    assert_eq!(s, KdaStatus::Weights);
    assert!(
        text.contains("o_norm.weight") && text.contains("matrices only"),
        "{text}"
    );
    // GGUF Q8_0: 34 bytes per 32 weights.
    let blocks = vec![0u8; 64 * 64 / 32 * 34];
    let q8 = |len: usize, dtype: u32| KdaTensor {
        data: blocks.as_ptr().cast(),
        len,
        dtype,
        layout: KDA_LAYOUT_ROWS,
        scales: std::ptr::null(),
        scales_len: 0,
    };
    assert_eq!(
        layer_status(q8(blocks.len(), KDA_DTYPE_GGUF_BASE + 8), None).0,
        KdaStatus::Ok
    );
    let (s, text) = layer_status(q8(blocks.len() - 34, KDA_DTYPE_GGUF_BASE + 8), None);
    assert_eq!(s, KdaStatus::Length, "{text}");
    let (s, text) = layer_status(q8(blocks.len(), KDA_DTYPE_GGUF_BASE + 99), None);
    assert_eq!(s, KdaStatus::Weights);
    assert!(text.contains("unknown GGUF block type"), "{text}");
    let panels = KdaTensor {
        layout: KDA_LAYOUT_PANELS,
        ..q8(blocks.len(), KDA_DTYPE_GGUF_BASE + 8)
    };
    let (s, text) = layer_status(panels, None);
    assert_eq!(s, KdaStatus::Weights);
    assert!(text.contains("row-major"), "{text}");
}
