//! Shape validation and planning are pure Rust: every bad argument is an error value, and no
//! input makes them panic.

use kda_core::{GateProj, KdaConfig, KdaError};
use kda_cuda::plan::{
    self, choose_chunk, chunked_smem_bytes, ChunkTable, IndexData, LayerDims, WorkspaceLayout,
    MAX_CHUNK,
};
use kda_cuda::CudaError;
use proptest::prelude::*;

#[test]
fn workspace_lengths_grow_with_tokens_and_cover_both_modes() {
    let cfg = KdaConfig::kimi_linear(2304, 32, 128);
    let d = LayerDims::new(&cfg).unwrap();
    let a = plan::forward_workspace_len(&cfg, 100).unwrap();
    let b = plan::forward_workspace_len(&cfg, 200).unwrap();
    assert!(b > a);
    assert!(WorkspaceLayout::forward(&d, 100, false).unwrap().total <= a);
    assert_eq!(WorkspaceLayout::forward(&d, 100, true).unwrap().total, a);
    assert!(
        plan::decode_workspace_len(&cfg, 64).unwrap()
            < plan::forward_workspace_len(&cfg, 64).unwrap()
    );
}

#[test]
fn kimi_shapes_fit_hopper_and_ampere_with_chunk_64() {
    for (h, k) in [(32usize, 128usize), (96, 128), (16, 64)] {
        let cfg = KdaConfig::kimi_k3(1024, h, k);
        let d = LayerDims::new(&cfg).unwrap();
        assert_eq!(d.k, k);
        assert_eq!(choose_chunk(k, 227 * 1024, None).unwrap(), 64);
        assert_eq!(choose_chunk(k, 163 * 1024, None).unwrap(), 64);
    }
    assert!(chunked_smem_bytes(MAX_CHUNK, 128) < 163 * 1024);
}

#[test]
fn gate_projection_forms_change_the_in_projection() {
    let mut cfg = KdaConfig::kimi_linear(64, 2, 16);
    let low = LayerDims::new(&cfg).unwrap();
    cfg.decay_proj = GateProj::FullRank;
    cfg.output_gate = GateProj::FullRank;
    let full = LayerDims::new(&cfg).unwrap();
    assert_eq!(full.p, 3 * 32 + 32 + 2 + 32);
    assert_eq!(low.p, 3 * 32 + 16 + 2 + 16);
    assert!(!full.decay_low_rank() && low.decay_low_rank());
}

#[test]
fn malformed_calls_are_errors() {
    let cfg = KdaConfig::kimi_linear(8, 1, 4);
    let e = plan::forward_shape(&cfg, 7, 7, &[0, 1]).unwrap_err();
    assert!(
        matches!(e, CudaError::Core(KdaError::Length { arg: "x", .. })),
        "{e:?}"
    );
    let e = plan::forward_shape(&cfg, 16, 8, &[0, 2]).unwrap_err();
    assert!(
        matches!(e, CudaError::Core(KdaError::Length { arg: "out", .. })),
        "{e:?}"
    );
    for cu in [
        &[][..],
        &[0][..],
        &[1, 2][..],
        &[0, 3][..],
        &[0, 2, 1, 2][..],
    ] {
        assert!(
            matches!(
                plan::forward_shape(&cfg, 16, 16, cu),
                Err(CudaError::Core(KdaError::Offsets { .. }))
            ),
            "{cu:?}"
        );
    }
    let mut bad = cfg;
    bad.l2_eps = f32::NAN;
    assert!(matches!(
        plan::forward_shape(&bad, 16, 16, &[0, 2]),
        Err(CudaError::Core(KdaError::Config { .. }))
    ));
    assert!(plan::decode_shape(&cfg, 9, 9).is_err());
    assert!(choose_chunk(4, 1 << 20, Some(0)).is_err());
    assert!(ChunkTable::new(&[0, 4], 0).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn planning_never_panics(
        hidden in 0usize..5000,
        heads in 0usize..40_000,
        k in 0usize..5000,
        w in 0usize..9,
        tokens in 0usize..100_000,
        lens in proptest::collection::vec(0usize..300, 0..8),
        x_extra in 0usize..3,
        smem in 0usize..300_000,
        chunk in proptest::option::of(0usize..100),
    ) {
        let mut cfg = KdaConfig::kimi_linear(hidden, heads, k);
        cfg.conv_width = w;
        let mut cu = vec![0usize];
        for l in &lens {
            cu.push(cu.last().unwrap() + l);
        }
        let t = *cu.last().unwrap();
        let x_len = t.saturating_mul(hidden).saturating_add(x_extra);
        let _ = plan::forward_shape(&cfg, x_len, x_len, &cu);
        let _ = plan::decode_shape(&cfg, x_len, x_len);
        let _ = plan::forward_workspace_len(&cfg, tokens);
        let _ = plan::decode_workspace_len(&cfg, tokens);
        if let Ok(d) = LayerDims::new(&cfg) {
            let _ = plan::conv_prefill(&d, tokens);
            let _ = plan::decode(&d, tokens);
            let _ = plan::recurrent(&d, tokens);
            if let Ok(c) = choose_chunk(d.k, smem, chunk) {
                prop_assert!((1..=MAX_CHUNK).contains(&c));
                prop_assert!(chunked_smem_bytes(c, d.k) <= smem);
                let table = ChunkTable::new(&cu, c).unwrap();
                prop_assert_eq!(table.first.len(), cu.len());
                let covered: usize = table.chunks.iter().map(|c| c[1] as usize).sum();
                prop_assert_eq!(covered, t);
                prop_assert!(table.chunks.iter().all(|ch| ch[1] >= 1 && ch[1] as usize <= c));
                let idx = IndexData::new(&cu, Some(&table)).unwrap();
                prop_assert_eq!(idx.data.len(), 2 * cu.len() + 2 * table.len());
                let _ = plan::chunk_intra(&d, table.len(), c);
                let _ = plan::chunk_state(&d, lens.len(), c);
            }
        }
    }
}
