//! The bf16 precision mode (`Precision::Bf16`): its error against the fla fixtures, and the
//! promises it keeps bitwise (decode = prefill, any thread count and block size, native
//! `vdpbf16ps` = the emulation).

use kda_conformance::{layer_fixtures, rel_rms, Fixture};
use kda_core::{
    Batch, Executor, ForwardOptions, InitialCaches, Isa, KdaConfig, KdaError, KdaLayer, Mode,
    Precision, Serial,
};
use kda_host::{OwnedLayer, Panels, SequenceCaches, WeightDtype};

/// Bound on the bf16 mode's rel-RMS against fla's fp32 reference (bf16 weights, f32
/// everywhere else): rounding each projection's input to bf16 (8 significant bits, relative
/// error ≤ 2⁻⁹) and the chain through q/k/v, the gates and `o_proj` give 3.1e-3 to 4.1e-3 on
/// the outputs and 2.2e-3 to 3.4e-3 on the final states of the bf16 fixtures (printed by the
/// test; the same bits on every path).
const BF16_TOL: f64 = 5e-3;

fn bf16_opts(mode: Mode, isa: Option<Isa>) -> ForwardOptions {
    ForwardOptions {
        isa,
        ..ForwardOptions::default()
            .with_mode(mode)
            .with_precision(Precision::Bf16)
    }
}

/// Runs `layer` over `x` (sequences `cu`) from `caches`, blocks of `block` tokens.
fn forward(
    layer: &KdaLayer<'_>,
    x: &[f32],
    cu: &[usize],
    caches: &mut SequenceCaches,
    (init, block): (InitialCaches, usize),
    exec: &dyn Executor,
) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    let mut ws = vec![0.0; layer.workspace_len(block, exec.workers()).unwrap()];
    let batch = Batch {
        x,
        cu_seqlens: cu,
        out: &mut out,
    };
    layer
        .forward(batch, caches.as_mut(), init, &mut ws, exec)
        .unwrap();
    out
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Every fixture with bf16 weights, in bf16 mode (recurrent and chunked): within
/// [`BF16_TOL`] of the reference, and really different from the exact mode.
#[test]
fn bf16_mode_error_against_the_fla_fixtures() {
    let names: Vec<String> = layer_fixtures()
        .into_iter()
        .filter(|n| n.contains("_bf16_"))
        .collect();
    assert!(!names.is_empty(), "no bf16 fixtures found");
    for name in names {
        let fx = Fixture::open(&name);
        let owned = fx.layer();
        let base = owned.weights().unwrap();
        let panels = Panels::new(&base).unwrap();
        let w = panels.weights(&base).unwrap();
        let (x, cu, want) = (fx.f32("hidden_states"), fx.cu_seqlens(), fx.f32("output"));
        for mode in [Mode::Recurrent, Mode::Chunked] {
            let run = |precision: Precision| {
                let opts = ForwardOptions::default()
                    .with_mode(mode)
                    .with_precision(precision);
                let layer = KdaLayer::new(&owned.cfg, w, opts).unwrap();
                let (mut caches, init) = fx.initial_caches();
                let out = forward(&layer, &x, &cu, &mut caches, (init, 64), &Serial);
                let state = rel_rms(&caches.recurrent, &fx.f32("final_recurrent_state"));
                (out, state)
            };
            let (exact, _) = run(Precision::Exact);
            let (bf16, state) = run(Precision::Bf16);
            let (e_exact, e_bf16) = (rel_rms(&exact, &want), rel_rms(&bf16, &want));
            println!(
                "{name:<40} {mode:?}: output rel-RMS exact {e_exact:.1e}, bf16 {e_bf16:.1e}; \
                 final state bf16 {state:.1e}"
            );
            assert!(
                e_bf16 <= BF16_TOL,
                "{name} {mode:?}: bf16 output {e_bf16:.2e}"
            );
            assert!(state <= BF16_TOL, "{name} {mode:?}: bf16 state {state:.2e}");
            assert!(
                !same_bits(&exact, &bf16),
                "{name}: bf16 mode changed nothing"
            );
        }
    }
}

/// Synthetic bf16 layers with odd widths (pair tails), both gate forms.
fn layers() -> Vec<OwnedLayer> {
    [
        KdaConfig::kimi_linear(70, 3, 32),
        KdaConfig::kimi_k3(37, 2, 16),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, cfg)| OwnedLayer::random(cfg, WeightDtype::Bf16, 11 + i as u64).unwrap())
    .collect()
}

fn inputs(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = kda_host::rng::Rng::new(seed);
    (0..n).map(|_| rng.normal()).collect()
}

/// bf16 mode: decode steps give bitwise the prefill's outputs and caches (one sequence,
/// recurrent), and every thread count and block size gives the same bits.
#[test]
fn bf16_decode_prefill_threads_and_blocks_agree_bitwise() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    for owned in layers() {
        let cfg = owned.cfg;
        let base = owned.weights().unwrap();
        let panels = Panels::new(&base).unwrap();
        let w = panels.weights(&base).unwrap();
        let layer = KdaLayer::new(&cfg, w, bf16_opts(Mode::Recurrent, None)).unwrap();
        let t = 23;
        let x = inputs(t * cfg.hidden, 5);
        let mut c1 = SequenceCaches::new(&cfg, 1).unwrap();
        let full = forward(
            &layer,
            &x,
            &[0, t],
            &mut c1,
            (InitialCaches::Zero, 64),
            &Serial,
        );
        // Decode, token by token.
        let mut c2 = SequenceCaches::new(&cfg, 1).unwrap();
        let mut ws = vec![0.0; layer.decode_workspace_len(1, 1).unwrap()];
        let mut steps = Vec::new();
        for row in x.chunks_exact(cfg.hidden) {
            let mut y = vec![0.0; cfg.hidden];
            layer
                .decode_step(row, &mut y, c2.as_mut(), &mut ws, &Serial)
                .unwrap();
            steps.extend(y);
        }
        assert!(
            same_bits(&full, &steps),
            "hidden {}: decode != prefill",
            cfg.hidden
        );
        assert!(same_bits(&c1.recurrent, &c2.recurrent));
        // Chunked prefill of two sequences: blocks of 5 and 64 tokens, 1 and 3 threads.
        let layer = KdaLayer::new(&cfg, w, bf16_opts(Mode::Chunked, None)).unwrap();
        let cu = [0, 9, t];
        let run = |block: usize, threads: bool| {
            let mut c = SequenceCaches::new(&cfg, 2).unwrap();
            let out = if threads {
                pool.install(|| {
                    let exec = kda_host::parallel::RayonExec;
                    forward(&layer, &x, &cu, &mut c, (InitialCaches::Zero, block), &exec)
                })
            } else {
                forward(
                    &layer,
                    &x,
                    &cu,
                    &mut c,
                    (InitialCaches::Zero, block),
                    &Serial,
                )
            };
            (out, c.recurrent)
        };
        let (a, sa) = run(64, false);
        for (block, threads) in [(16, false), (64, true), (16, true)] {
            let (b, sb) = run(block, threads);
            assert!(
                same_bits(&a, &b) && same_bits(&sa, &sb),
                "block {block} threads {threads}"
            );
        }
    }
}

/// The native pair operations (`Isa::Avx512Bf16`) give the bits of their emulation on the
/// same f32 kernels (`Isa::Avx512F`), through the whole layer.
#[test]
fn bf16_native_equals_emulated_layer() {
    if !Isa::Avx512Bf16.is_supported() {
        println!("skipped: no {}", Isa::Avx512Bf16.feature());
        return;
    }
    for owned in layers() {
        let cfg = owned.cfg;
        let base = owned.weights().unwrap();
        let panels = Panels::new(&base).unwrap();
        let w = panels.weights(&base).unwrap();
        let x = inputs(40 * cfg.hidden, 9);
        let outs: Vec<Vec<f32>> = [Isa::Avx512F, Isa::Avx512Bf16]
            .into_iter()
            .map(|isa| {
                let layer = KdaLayer::new(&cfg, w, bf16_opts(Mode::Auto, Some(isa))).unwrap();
                let mut c = SequenceCaches::new(&cfg, 2).unwrap();
                forward(
                    &layer,
                    &x,
                    &[0, 17, 40],
                    &mut c,
                    (InitialCaches::Zero, 64),
                    &Serial,
                )
            })
            .collect();
        assert!(same_bits(&outs[0], &outs[1]), "hidden {}", cfg.hidden);
    }
}

/// bf16 mode without bf16 panel-layout weights is refused up front, naming the option.
#[test]
fn bf16_mode_needs_panel_weights() {
    for dtype in [WeightDtype::Bf16, WeightDtype::F32] {
        let owned = OwnedLayer::random(KdaConfig::kimi_linear(64, 2, 32), dtype, 3).unwrap();
        let err = owned
            .kda_layer(bf16_opts(Mode::Auto, None))
            .expect_err("row-major weights in bf16 mode");
        match err {
            KdaError::Config { field, reason } => {
                assert_eq!(field, "precision");
                assert!(reason.contains("panel layout"), "{reason}");
            }
            e => panic!("unexpected error {e:?}"),
        }
    }
}
