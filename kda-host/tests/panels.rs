//! Weights repacked into the panel layout give bitwise the same layer as the row-major
//! checkpoint layout: prefill (every mode), decode, caches, on 1 and 2 threads.

use kda_core::{ForwardOptions, InitialCaches, KdaConfig, KdaLayer, KdaWeights};
use kda_host::rng::Rng;
use kda_host::{Mode, OwnedLayer, Panels, Runner, SequenceCaches, WeightDtype};

fn run(
    threads: usize,
    cfg: &KdaConfig,
    w: &KdaWeights<'_>,
    x: &[f32],
    cu: &[usize],
    mode: Mode,
) -> (Vec<f32>, Vec<f32>, SequenceCaches) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let mut runner = Runner::new(40);
        let mut caches = SequenceCaches::new(cfg, cu.len() - 1).unwrap();
        let layer = KdaLayer::new(cfg, *w, ForwardOptions::default().with_mode(mode)).unwrap();
        let y = runner
            .forward(&layer, x, cu, &mut caches, InitialCaches::Zero)
            .unwrap();
        let mut steps = Vec::new();
        for s in 0..3 {
            let step = Rng::new(3 + s).normals((cu.len() - 1) * cfg.hidden, 1.0);
            steps.extend(runner.decode(&layer, &step, &mut caches).unwrap());
        }
        (y, steps, caches)
    })
}

#[test]
fn panel_layout_gives_the_row_major_bits() {
    // Row counts that are and are not multiples of 16, low-rank and full-rank gates.
    for cfg in [
        KdaConfig::kimi_linear(72, 3, 16),
        KdaConfig::kimi_k3(40, 5, 8),
    ] {
        let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, 21).unwrap();
        let rows = layer.weights().unwrap();
        let panels = Panels::new(&rows).unwrap();
        assert!(panels.bytes() > 0);
        let packed = panels.weights(&rows).unwrap();
        assert!(packed.q_proj.is_panels() && packed.o_proj.is_panels());
        let cu = [0usize, 3, 4, 61, 100];
        let x = Rng::new(2).normals(100 * cfg.hidden, 1.0);
        for mode in [Mode::Auto, Mode::Recurrent, Mode::Chunked] {
            for threads in [1, 2] {
                let a = run(threads, &cfg, &rows, &x, &cu, mode);
                let b = run(threads, &cfg, &packed, &x, &cu, mode);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&a.0), bits(&b.0), "prefill {mode:?} {threads}");
                assert_eq!(bits(&a.1), bits(&b.1), "decode {mode:?} {threads}");
                assert_eq!(bits(&a.2.recurrent), bits(&b.2.recurrent));
                assert_eq!(bits(&a.2.conv_v), bits(&b.2.conv_v));
            }
        }
    }
}

#[test]
fn panels_refuse_what_they_cannot_hold() {
    let cfg = KdaConfig::kimi_linear(32, 2, 8);
    let f32_layer = OwnedLayer::random(cfg, WeightDtype::F32, 1).unwrap();
    let w = f32_layer.weights().unwrap();
    // f32 matrices stay row-major (nothing to repack), and the result is usable as is.
    let p = Panels::new(&w).unwrap();
    assert_eq!(p.bytes(), 0);
    assert!(!p.weights(&w).unwrap().q_proj.is_panels());
    // Panel-layout bf16 data of the wrong length, or f32 data, is an error.
    let v = vec![kda_core::bf16::ZERO; 10];
    assert!(kda_core::MatRef::new_panels("w", kda_core::Data::Bf16(&v), 3, 4).is_err());
    let f = vec![0.0f32; 64];
    assert!(kda_core::MatRef::new_panels("w", kda_core::Data::F32(&f), 4, 4).is_err());
}
